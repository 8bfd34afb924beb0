package attach

import (
	"context"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/faults"
	"github.com/gpu-dra/gpu-dra/internal/listing"
)

// Attacher attaches the devices of its node's pool as their claims get allocated.
type Attacher struct {
	driver, node string
	client       kubernetes.Interface
	delay        func() time.Duration
	fault        func(device string) *faults.Fault
	now          func() time.Time

	informer cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[cache.ObjectName]
}

// Option configures an Attacher.
type Option func(*Attacher)

// WithDelay sets how long an attach takes, asked at each attach (the node's group may change);
// default no delay.
func WithDelay(delay func() time.Duration) Option { return func(a *Attacher) { a.delay = delay } }

// WithFaults makes the attach of a device fail while it has an attach-failure fault.
func WithFaults(current func() faults.Faults) Option {
	return func(a *Attacher) {
		a.fault = func(device string) *faults.Fault {
			f, ok := current()[device]
			if !ok || f.Kind != faults.KindAttachFailure {
				return nil
			}
			return &f
		}
	}
}

// claimsPageSize is the page of the claims list: a page is decoded whole before it is kept, a
// megabyte at 500 claims of 2 KB.
const claimsPageSize = 500

// New returns an attacher of driver's devices on node. It reads claims through resource.k8s.io/v1,
// the only version with binding conditions the plugin publishes (1.34+). RBAC: resourceclaims list
// and watch in all namespaces, resourceclaims/status patch (the chart's admission policy narrows
// the latter to this driver's entries on claims allocated to this node).
func New(client kubernetes.Interface, driver, node string, opts ...Option) *Attacher {
	a := &Attacher{
		driver: driver, node: node, client: client,
		delay: func() time.Duration { return 0 },
		fault: func(string) *faults.Fault { return nil },
		now:   time.Now,
	}
	for _, o := range opts {
		o(a)
	}
	claims := client.ResourceV1().ResourceClaims(metav1.NamespaceAll)
	// Keep of each claim only what the attacher reads, and of other nodes' and drivers' claims
	// nothing but the name: the cache of every claim in the cluster stays small. The list is read
	// in pages, each kept as it arrives, so that every node's plugin never holds all the cluster's
	// claims decoded at once; watch events go through the informer's transform.
	a.informer = cache.NewSharedIndexInformer(listing.Plain(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			out := &resourceapi.ResourceClaimList{}
			err := listing.InPages(ctx, o, claimsPageSize, claims.List, func(page *resourceapi.ResourceClaimList) {
				for i := range page.Items {
					out.Items = append(out.Items, *a.keep(&page.Items[i]))
				}
				out.ResourceVersion = page.ResourceVersion
			})
			return out, err
		},
		WatchFuncWithContext: claims.Watch,
	}), &resourceapi.ResourceClaim{}, 0, cache.Indexers{})
	_ = a.informer.SetTransform(func(obj any) (any, error) {
		claim, ok := obj.(*resourceapi.ResourceClaim)
		if !ok {
			return obj, nil
		}
		return a.keep(claim), nil
	})
	a.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[cache.ObjectName](),
		workqueue.TypedRateLimitingQueueConfig[cache.ObjectName]{Name: "attach"})
	enqueue := func(obj any) {
		if claim, ok := obj.(*resourceapi.ResourceClaim); ok && len(Pending(claim, a.driver, a.node)) > 0 {
			a.queue.Add(cache.MetaObjectToName(claim))
		}
	}
	_, _ = a.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	})
	return a
}

// keep is what the cache holds of a claim: name, UID and deletion, and the allocation results and
// status entries of this node's pool of this driver.
func (a *Attacher) keep(claim *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	out := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{
		Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID,
		ResourceVersion: claim.ResourceVersion, DeletionTimestamp: claim.DeletionTimestamp,
	}}
	alloc := claim.Status.Allocation
	if alloc == nil {
		return out
	}
	mine := &resourceapi.AllocationResult{AllocationTimestamp: alloc.AllocationTimestamp}
	for _, r := range alloc.Devices.Results {
		if r.Driver == a.driver && r.Pool == a.node {
			mine.Devices.Results = append(mine.Devices.Results, r)
		}
	}
	if len(mine.Devices.Results) == 0 {
		return out
	}
	out.Status.Allocation = mine
	for _, d := range claim.Status.Devices {
		if d.Driver == a.driver && d.Pool == a.node {
			out.Status.Devices = append(out.Status.Devices, d)
		}
	}
	return out
}

// Run attaches until ctx is canceled.
func (a *Attacher) Run(ctx context.Context) {
	defer utilruntime.HandleCrash()
	logger := klog.FromContext(ctx).WithName("attach")
	ctx = klog.NewContext(ctx, logger)
	go a.informer.RunWithContext(ctx)
	go func() { <-ctx.Done(); a.queue.ShutDown() }()
	if !cache.WaitForCacheSync(ctx.Done(), a.informer.HasSynced) {
		return
	}
	logger.V(2).Info("Attaching the node's attachable devices as they are allocated")
	for a.next(ctx) {
	}
}

func (a *Attacher) next(ctx context.Context) bool {
	key, shutdown := a.queue.Get()
	if shutdown {
		return false
	}
	defer a.queue.Done(key)
	retryIn, err := a.sync(ctx, key)
	switch {
	case err != nil:
		klog.FromContext(ctx).Error(err, "Attaching failed; retrying", "claim", klog.KRef(key.Namespace, key.Name))
		a.queue.AddRateLimited(key)
	case retryIn > 0:
		a.queue.Forget(key)
		a.queue.AddAfter(key, retryIn)
	default:
		a.queue.Forget(key)
	}
	return true
}

// sync attaches the pending devices of one claim once they are due; it returns how long until
// they are when they are not yet.
func (a *Attacher) sync(ctx context.Context, key cache.ObjectName) (time.Duration, error) {
	obj, exists, err := a.informer.GetStore().GetByKey(key.String())
	if err != nil || !exists {
		return 0, err
	}
	claim := obj.(*resourceapi.ResourceClaim)
	pending := Pending(claim, a.driver, a.node)
	if len(pending) == 0 {
		return 0, nil
	}
	now := a.now()
	if wait := Due(claim, a.delay()).Sub(now); wait > 0 {
		return wait, nil
	}
	results := make([]Result, 0, len(pending))
	for _, t := range pending {
		results = append(results, Result{Target: t, Conditions: Outcome(t, a.node, a.fault(t.Device), now)})
	}
	// The attacher's entries of earlier attaches of this allocation stay in what it applies.
	results = append(results, a.decidedResults(claim)...)
	if err := Write(ctx, a.client, a.driver, claim, results); err != nil {
		if ignorable(err) {
			klog.FromContext(ctx).V(2).Info("Claim changed before its attach was written; waiting for its next change", "claim", klog.KObj(claim), "err", err)
			return 0, nil
		}
		return 0, err
	}
	logResults(klog.FromContext(ctx), klog.KObj(claim), results[:len(pending)])
	return 0, nil
}

// decidedResults are the devices of the claim whose attach is already written: an apply that left
// them out would remove their conditions.
func (a *Attacher) decidedResults(claim *resourceapi.ResourceClaim) []Result {
	var out []Result
	for _, r := range claim.Status.Allocation.Devices.Results {
		if len(r.BindingConditions) == 0 || !decided(claim.Status.Devices, r) {
			continue
		}
		for _, d := range claim.Status.Devices {
			if d.Driver == r.Driver && d.Pool == r.Pool && d.Device == r.Device {
				out = append(out, Result{Target: Target{Pool: r.Pool, Device: r.Device}, Conditions: d.Conditions})
			}
		}
	}
	return out
}

// Write applies the results as the attacher's part of the claim's status.devices.
func Write(ctx context.Context, client kubernetes.Interface, driver string, claim *resourceapi.ResourceClaim, results []Result) error {
	ac := applyConfiguration(claim.Namespace, claim.Name, claim.UID, driver, results)
	_, err := client.ResourceV1().ResourceClaims(claim.Namespace).ApplyStatus(ctx, ac,
		metav1.ApplyOptions{FieldManager: FieldManager(driver), Force: true})
	if err != nil {
		return fmt.Errorf("claim %s: write status.devices conditions: %w", klog.KObj(claim), err)
	}
	return nil
}

// FieldManager is the attacher's server-side apply field manager.
func FieldManager(driver string) string { return driver + "/attacher" }
