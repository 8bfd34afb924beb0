package scale

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// claimNamespaces is how many namespaces the held claims are spread over: a fleet's claims belong
// to many teams, and the webhook and kubectl dra read them across namespaces.
const claimNamespaces = 20

// heldRequest is the one request of every held claim: one GPU of the driver's class.
const heldRequest = "gpu"

// deviceRef is one published device: where it is and what an allocation names.
type deviceRef struct{ Node, Pool, Device string }

// claimsFor is how many claims hold a fraction of devices, one device each.
func claimsFor(fraction float64, devices int) (int, error) {
	if math.IsNaN(fraction) || fraction < 0 || fraction > 1 {
		return 0, fmt.Errorf("--claims=%v: want a fraction of the GPUs allocated, 0 to 1", fraction)
	}
	n := int(math.Round(fraction * float64(devices)))
	if n > maxClaims {
		return 0, fmt.Errorf("--claims=%v: %d claims for %d GPUs; want at most %d (a smaller fraction or fleet)", fraction, n, devices, maxClaims)
	}
	return n, nil
}

// spread orders the devices so that the first k of them are spread over the nodes: every node's
// first device, then every node's second, and so on. Taken in that order, as soon as there are as
// many claims as nodes no node has all its GPUs free, like a busy fleet and unlike one filled
// node by node.
func spread(devices []deviceRef) []deviceRef {
	sorted := slices.Clone(devices)
	slices.SortFunc(sorted, func(a, b deviceRef) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Device, b.Device))
	})
	rank := make([]int, len(sorted))
	for i := range sorted {
		if i > 0 && sorted[i].Node == sorted[i-1].Node {
			rank[i] = rank[i-1] + 1
		}
	}
	idx := make([]int, len(sorted))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(rank[a], rank[b]) })
	out := make([]deviceRef, len(sorted))
	for i, j := range idx {
		out[i] = sorted[j]
	}
	return out
}

// heldClaim is the i-th held claim: one GPU of class, in one of claimNamespaces namespaces.
func heldClaim(i int, class string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("held-%05d", i), Namespace: claimNamespace(i), Labels: map[string]string{"app": "scale-held"}},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name:    heldRequest,
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
	}
}

func claimNamespace(i int) string { return fmt.Sprintf("scale-claims-%02d", i%claimNamespaces) }

// allocation is what the scheduler would write for a claim of heldClaim given d: the device and
// the node it is on.
func allocation(driver string, d deviceRef) *resourceapi.AllocationResult {
	return &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: heldRequest, Driver: driver, Pool: d.Pool, Device: d.Device,
		}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{d.Node}}},
		}}},
	}
}

// allocationPatch is the merge patch of a claim's status that sets alloc, or removes the
// allocation when alloc is nil.
func allocationPatch(alloc *resourceapi.AllocationResult) ([]byte, error) {
	return json.Marshal(map[string]any{"status": map[string]any{"allocation": alloc}})
}

// churnStep is the i-th change of a churn of `changes` changes over the first claims: the first
// half deallocates claims 0, 1, ..., the second half allocates them again, so the fleet ends as
// it began.
func churnStep(i, changes, claims int) (claim int, allocate bool) {
	half := max(min((changes+1)/2, claims), 1)
	return i % half, (i/half)%2 == 1
}

// holder writes the held claims: created, then allocated by a status write naming a published
// device, as the scheduler would, for the fleet is far larger than the scheduler places in a run.
// Its client acts as the controller-manager (see newHolder); every write is bounded by workers.
type holder struct {
	cs      kubernetes.Interface
	driver  string
	class   string
	workers int
	devices []deviceRef // spread; claim i holds devices[i]
	claims  int
}

// listDevices reads every published device of the driver, a page at a time.
func listDevices(ctx context.Context, cs kubernetes.Interface, driver string) ([]deviceRef, error) {
	var out []deviceRef
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := cs.ResourceV1().ResourceSlices().List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list ResourceSlices: %w", err)
		}
		for _, s := range list.Items {
			if s.Spec.Driver != driver || s.Spec.NodeName == nil {
				continue
			}
			for _, d := range s.Spec.Devices {
				out = append(out, deviceRef{Node: *s.Spec.NodeName, Pool: s.Spec.Pool.Name, Device: d.Name})
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return out, nil
		}
	}
}

// write creates and allocates the held claims, claimNamespaces namespaces first.
func (h *holder) write(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	for i := range min(h.claims, claimNamespaces) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: claimNamespace(i)}}
		if _, err := h.cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create namespace %s: %w", ns.Name, err)
		}
	}
	start := time.Now()
	var done atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(h.workers)
	for i := range h.claims {
		g.Go(func() error {
			c := heldClaim(i, h.class)
			if _, err := h.cs.ResourceV1().ResourceClaims(c.Namespace).Create(gctx, c, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create ResourceClaim %s/%s: %w", c.Namespace, c.Name, err)
			}
			if err := h.set(gctx, i, true); err != nil {
				return err
			}
			if n := done.Add(1); n%5000 == 0 {
				logger.Info("Claims allocated", "done", n, "of", h.claims, "elapsed", time.Since(start).Round(time.Second))
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	logger.Info("Held claims written", "claims", h.claims, "namespaces", min(h.claims, claimNamespaces), "elapsed", time.Since(start).Round(time.Millisecond))
	return nil
}

// set allocates claim i its device, or deallocates it.
func (h *holder) set(ctx context.Context, i int, allocate bool) error {
	var alloc *resourceapi.AllocationResult
	if allocate {
		alloc = allocation(h.driver, h.devices[i])
	}
	patch, err := allocationPatch(alloc)
	if err != nil {
		return err
	}
	c := heldClaim(i, h.class)
	if _, err := h.cs.ResourceV1().ResourceClaims(c.Namespace).Patch(ctx, c.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("ResourceClaim %s/%s: status.allocation (allocate=%t): %w", c.Namespace, c.Name, allocate, err)
	}
	return nil
}

// churn changes the allocations at rate for changes changes (churnStep), then allocates again
// whatever the last of them left deallocated.
func (h *holder) churn(ctx context.Context, rate, changes int) (*result, error) {
	res := drive(ctx, "claims churn", rate, changes, func(ctx context.Context, i int) error {
		claim, allocate := churnStep(i, changes, h.claims)
		return h.set(ctx, claim, allocate)
	})
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(h.workers)
	for i := range min(h.claims, max((changes+1)/2, 1)) {
		g.Go(func() error { return h.set(gctx, i, true) })
	}
	return res, g.Wait()
}
