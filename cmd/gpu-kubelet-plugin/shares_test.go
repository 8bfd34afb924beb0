package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

const (
	// sharedInventory makes every GPU of the node a shared-memory GPU with the default policies.
	sharedInventory = "defaults: {sharing: {mode: shared-memory}}\n"
	fallbackLine    = "Node group sharing falls back to exclusive"
	// consumableCapacity turns on KEP-5075 in a 1.34 API server (alpha there, beta from 1.36).
	consumableCapacity = "DRAConsumableCapacity=true"
)

func (c *cluster) inventory(t testing.TB, content string) string {
	t.Helper()
	path := filepath.Join(filepath.Dir(c.kubeconfig), "inventory.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return "--node-groups=" + path
}

// sharedClaim creates a claim asking for a share of memory and writes the allocation the scheduler
// would: a share of device with a new share ID and what it consumes.
func (c *cluster) sharedClaim(t testing.TB, ctx context.Context, name, device, memory, compute string) *resourceapi.ResourceClaim {
	t.Helper()
	consumed := map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(memory), "compute": resource.MustParse(compute)}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: driverName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
				Capacity: &resourceapi.CapacityRequirements{Requests: consumed},
			},
		}}}},
	}
	created, err := c.claims.ResourceClaims(namespace).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create claim %s: %v", name, err)
	}
	share := uuid.NewUUID()
	created.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: driverName, Pool: c.node, Device: device, ShareID: &share, ConsumedCapacity: consumed,
		}},
	}}
	updated, err := c.claims.ResourceClaims(namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("allocate claim %s: %v", name, err)
	}
	if r := updated.Status.Allocation.Devices.Results[0]; r.ShareID == nil || *r.ShareID != share {
		t.Fatalf("the API server dropped the share ID of claim %s: %+v", name, r)
	}
	return updated
}

// TestShares runs the plugin with a shared-memory node group against a 1.34 API server with
// consumable capacity on: it publishes shared GPUs, prepares shares of one GPU for several
// claims, refuses a share that would over-commit it, and loses or duplicates nothing when killed
// between and during prepares of shares.
func TestShares(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := newCluster(t, v1Only, nil, testapiserver.WithFeatureGates(consumableCapacity))
	inv := c.inventory(t, sharedInventory)
	p := c.startPlugin(t, "", inv)
	k := p.register(ctx, false)

	devices := waitForSlices(t, ctx, c, "v1", 8)
	for _, d := range devices {
		if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
			t.Errorf("%s: allowMultipleAllocations %v", d.Name, d.AllowMultipleAllocations)
		}
		for _, name := range []resourceapi.QualifiedName{"memory", "compute"} {
			if cp := d.Capacity[name]; cp.RequestPolicy == nil || cp.RequestPolicy.ValidRange == nil || cp.RequestPolicy.ValidRange.Min == nil ||
				cp.RequestPolicy.ValidRange.Step == nil || cp.RequestPolicy.ValidRange.Max == nil {
				t.Errorf("%s: capacity %s %+v, want a requestPolicy with min, step and max", d.Name, name, cp)
			}
		}
	}

	// Ten shares of 8Gi fill gpu-0's 80Gi exactly (and half of its compute).
	const n = 10
	claims := make([]*resourceapi.ResourceClaim, n)
	for i := range claims {
		claims[i] = c.sharedClaim(t, ctx, fmt.Sprintf("share-%d", i), "gpu-0", "8Gi", "5")
	}
	seen := map[string]prepared{}
	for _, claim := range claims[:2] {
		res, err := k.prepare(ctx, claim)
		if err != nil {
			t.Fatal(err)
		}
		seen[claim.Name] = res[claim.UID]
	}
	if reflect.DeepEqual(seen["share-0"], seen["share-1"]) {
		t.Errorf("two shares of gpu-0 got the same CDI device: %v", seen["share-0"])
	}
	for name, ids := range seen {
		share := string(*claimByName(claims, name).Status.Allocation.Devices.Results[0].ShareID)
		if got := ids[c.node+"/gpu-0"]; len(got) == 0 || !strings.HasSuffix(got[0], "-gpu-0-"+share) {
			t.Errorf("claim %s: CDI IDs %v, want the GPU's first, ending in -gpu-0-%s", name, got, share)
		}
	}
	// Between shares: the process dies after a share is prepared and before the next.
	p.kill()

	// During prepares: killed at a different moment each round while the kubelet keeps preparing
	// the remaining shares.
	for round := 0; round < 3; round++ {
		p = c.startPlugin(t, "", inv)
		k = p.register(ctx, false)
		c.consistent(t)
		p.killDuring(1, time.Duration(round*700)*time.Microsecond, func(progress func()) {
			for _, claim := range claims {
				if _, ok := seen[claim.Name]; ok {
					continue
				}
				res, err := k.prepare(ctx, claim)
				if err != nil {
					return // the plugin died
				}
				seen[claim.Name] = res[claim.UID]
				progress()
			}
		})
		t.Logf("round %d: killed with %d shares prepared as far as the kubelet knows", round, len(seen))
	}

	p = c.startPlugin(t, "", inv)
	k = p.register(ctx, false)
	c.consistent(t)
	all, err := k.prepare(ctx, claims...)
	if err != nil {
		t.Fatal(err)
	}
	for name, before := range seen {
		if got := all[claimByName(claims, name).UID]; !reflect.DeepEqual(got, before) {
			t.Errorf("share %s prepares to %v, the kubelet was told %v", name, got, before)
		}
	}
	entries := c.consistent(t)
	shares := map[string]types.UID{}
	for uid, e := range entries {
		for _, d := range e.Devices {
			if other, dup := shares[d.ShareID]; dup || d.ShareID == "" {
				t.Errorf("claim %s: share %q of %s (also in %s)", uid, d.ShareID, d.Device, other)
			}
			shares[d.ShareID] = uid
		}
	}
	if len(entries) != n || len(shares) != n {
		t.Errorf("%d claims with %d shares prepared, want %d each", len(entries), len(shares), n)
	}

	// The GPU is full: one more share is refused, naming what holds it; after one unprepare it fits.
	extra := c.sharedClaim(t, ctx, "extra", "gpu-0", "8Gi", "5")
	if _, err := k.prepare(ctx, extra); err == nil || !strings.Contains(err.Error(), "a share of memory 8Gi does not fit in its 80Gi beside the shares prepared") {
		t.Errorf("share beyond a full GPU: %v", err)
	}
	if err := k.unprepare(ctx, claims[3]); err != nil {
		t.Fatal(err)
	}
	if entries := c.consistent(t); len(entries) != n-1 {
		t.Errorf("after one unprepare: %d claims prepared, want %d", len(entries), n-1)
	}
	if _, err := k.prepare(ctx, extra); err != nil {
		t.Errorf("share after one was released: %v", err)
	}
	logs, _ := os.ReadFile(p.log)
	if strings.Contains(string(logs), fallbackLine) {
		t.Errorf("the plugin fell back although the API server keeps the fields:\n%s", tail(string(logs), 20))
	}
	if metrics := scrape(t, p); strings.Contains(metrics, `component="publish_dropped_fields"`) {
		t.Errorf("the API server dropped fields of our slices:\n%s", metrics)
	}
}

// TestSharesFallBack: where the API server drops consumable capacity (1.34 by default, 1.36 and
// later with the gate off), the same inventory publishes exclusive GPUs and says why, once.
func TestSharesFallBack(t *testing.T) {
	checkFallBack(t, map[string]string{"1.34": "", "1.37": "DRAConsumableCapacity=false,DRAFractionalCapacityRange=false"}, sharedInventory, "defaults: {count: 4, sharing: {mode: shared-memory}}\n",
		`group="defaults" want="shared-memory" reason="API server drops allowMultipleAllocations (DRAConsumableCapacity off)"`,
		func(d resourceapi.Device) bool {
			return d.AllowMultipleAllocations == nil && len(d.Capacity) == 1 && d.Capacity["memory"].RequestPolicy == nil
		})
}

// checkFallBack runs the plugin with a sharing inventory against an API server with the feature
// off (off[release]: the feature gates that turn it off there): the seed's whole GPUs are
// published (each exclusive by its own judgement), a whole device is prepared, a change of the
// inventory to changed re-publishes, and the fallback line is logged once, as want.
func checkFallBack(t *testing.T, off map[string]string, inventory, changed, want string, exclusive func(resourceapi.Device) bool) {
	t.Helper()
	minor := testapiserver.Minor(t)
	gates, ok := off[minor]
	if !ok {
		t.Skipf("SKIPPED: no expectations for kube-apiserver %s", minor)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := newCluster(t, v1Only, nil, testapiserver.WithFeatureGates(gates))
	inv := c.inventory(t, inventory)
	p := c.startPlugin(t, "", inv, "--node-groups-poll-interval=200ms")
	k := p.register(ctx, false)
	devices := waitForSlices(t, ctx, c, "v1", 8)
	checkSeedDevices(t, c.node, devices)
	for _, d := range devices {
		if !exclusive(d) {
			t.Errorf("%s published shared where the API server drops it: %+v", d.Name, d)
		}
	}
	// Whole devices work as always.
	if _, err := k.prepare(ctx, c.allocatedClaim(t, ctx, "whole", []string{"gpu-0"})); err != nil {
		t.Fatal(err)
	}
	// A change of the inventory file re-publishes without saying it again.
	c.inventory(t, changed)
	waitForSlices(t, ctx, c, "v1", 4)
	logs, _ := os.ReadFile(p.log)
	if n := strings.Count(string(logs), fallbackLine); n != 1 || !strings.Contains(string(logs), want) {
		t.Errorf("the plugin logged %q %d times, want once as %s:\n%s", fallbackLine, n, want, tail(string(logs), 30))
	}
	if metrics := scrape(t, p); strings.Contains(metrics, `component="publish_dropped_fields"`) {
		t.Errorf("the API server dropped fields of our slices:\n%s", metrics)
	}
}
