package fleetmetrics

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
	"github.com/gpu-dra/gpu-dra/internal/analysis/diagnosis"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/webhook/fleetmetrics/fleetmetricstest"
)

const driver = "gpu.example.com"

var now = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

// gpus is a slice of node's pool (generation gen) with a device per model, named gpu-0, gpu-1, …
func gpus(drv, node string, gen int64, models ...string) *resourceapi.ResourceSlice {
	sl := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", node, drv, gen)},
		Spec: resourceapi.ResourceSliceSpec{Driver: drv, NodeName: ptr.To(node),
			Pool: resourceapi.ResourcePool{Name: node, Generation: gen, ResourceSliceCount: 1}},
	}
	for i, m := range models {
		sl.Spec.Devices = append(sl.Spec.Devices, resourceapi.Device{Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				deviceschema.AttrModel: {StringValue: ptr.To(m)},
				deviceschema.AttrUUID:  {StringValue: ptr.To(fmt.Sprintf("uuid-%s-%d", node, i))},
			}})
	}
	return sl
}

func repeat(model string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = model
	}
	return out
}

func tainted(sl *resourceapi.ResourceSlice, device int, effect resourceapi.DeviceTaintEffect) *resourceapi.ResourceSlice {
	sl.Spec.Devices[device].Taints = []resourceapi.DeviceTaint{{Key: "gpu.example.com/xid", Value: "79", Effect: effect}}
	return sl
}

// allocated is a claim holding node's devices, reserved for a pod.
func allocated(name, node string, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name}}}}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: driver, Pool: node, Device: d})
	}
	return c
}

// pending is a claim without an allocation created age ago, made for a pod from its template or
// standalone.
func pending(name string, age time.Duration, forPod bool) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", CreationTimestamp: metav1.NewTime(now.Add(-age))}}
	if forPod {
		c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: name + "-pod", UID: "u", Controller: ptr.To(true)}}
	}
	return c
}

type claimList []*inventory.Claim

func (l claimList) Claims() ([]*inventory.Claim, error) { return l, nil }

// observe runs the webhook's index of current allocations over the slices and claims, as kept by
// the inventory, with c observing its rebuild.
func observe(t *testing.T, c *Collector, slices []*resourceapi.ResourceSlice, claims []*resourceapi.ResourceClaim) {
	t.Helper()
	in := inventory.NewInterner()
	var kept claimList
	for _, cl := range claims {
		kept = append(kept, inventory.KeepClaim(cl))
	}
	var nodes []*v1.Node
	seen := map[string]bool{}
	for _, sl := range slices {
		if n := *sl.Spec.NodeName; !seen[n] {
			seen[n] = true
			nodes = append(nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
		}
	}
	objs := &inventory.Objects{CompactSlices: inventory.Compact(in, slices), CompactNodes: inventory.CompactNodes(in, nodes)}
	view := feasibility.New(objs, celcheck.New(driver, deviceschema.DeviceSchema()))
	done := make(chan struct{}, 1)
	held := diagnosis.NewHeld(view, kept, diagnosis.WithRebuildObserver(func(r diagnosis.Rebuilt) {
		c.Observe(r)
		done <- struct{}{}
	}))
	held.Invalidate()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("no rebuild observed")
	}
}

var (
	dev     = fleetmetricstest.Devices
	waiting = fleetmetricstest.Pending
	oldest  = fleetmetricstest.Oldest
)

const droppedSeries = fleetmetricstest.Dropped

func scrape(t *testing.T, c *Collector) map[string]float64 { return fleetmetricstest.Gather(t, c) }

func TestCollector(t *testing.T) {
	var many []*resourceapi.ResourceSlice
	for i := range 40 {
		// Model m00 has 40 devices, m01 39, … m39 1: the 31 largest keep their series.
		many = append(many, gpus(driver, fmt.Sprintf("n%02d", i), 1, repeat(fmt.Sprintf("m%02d", i), 40-i)...))
	}
	long := strings.Repeat("é", 40) // 80 bytes
	for _, tc := range []struct {
		name   string
		slices []*resourceapi.ResourceSlice
		claims []*resourceapi.ResourceClaim
		// want are the series expected not to be 0; every other series of the families
		// exported must be 0, and models names the models expected.
		want   map[string]float64
		models []string
	}{
		{
			name: "free and allocated by model, in mixed slices too",
			slices: []*resourceapi.ResourceSlice{
				gpus(driver, "a", 1, repeat("A100", 8)...),
				gpus(driver, "b", 1, "A100", "H100", "A100", "H100"),
				gpus("nic.example.com", "a", 1, "NIC", "NIC"),
			},
			claims: []*resourceapi.ResourceClaim{allocated("one", "a", "gpu-0"), allocated("two", "b", "gpu-1", "gpu-2")},
			want:   map[string]float64{dev("A100", "free"): 8, dev("A100", "allocated"): 2, dev("H100", "free"): 1, dev("H100", "allocated"): 1},
			models: []string{"A100", "H100"},
		},
		{
			name:   "a tainted device is unhealthy, held or not; PreferNoSchedule does not count",
			slices: []*resourceapi.ResourceSlice{tainted(tainted(tainted(gpus(driver, "a", 1, repeat("A100", 4)...), 0, resourceapi.DeviceTaintEffectNoSchedule), 1, resourceapi.DeviceTaintEffectNoExecute), 2, "PreferNoSchedule")},
			claims: []*resourceapi.ResourceClaim{allocated("one", "a", "gpu-0", "gpu-3")},
			want:   map[string]float64{dev("A100", "unhealthy"): 2, dev("A100", "allocated"): 1, dev("A100", "free"): 1},
			models: []string{"A100"},
		},
		{
			name:   "only the newest generation of a pool",
			slices: []*resourceapi.ResourceSlice{gpus(driver, "a", 1, repeat("A100", 4)...), gpus(driver, "a", 2, repeat("A100", 2)...)},
			want:   map[string]float64{dev("A100", "free"): 2},
			models: []string{"A100"},
		},
		{
			name:   "a device without a model; a model too long is cut at a character",
			slices: []*resourceapi.ResourceSlice{gpus(driver, "a", 1, "", long)},
			want:   map[string]float64{dev("", "free"): 1, dev(strings.Repeat("é", 32), "free"): 1},
			models: []string{"", strings.Repeat("é", 32)},
		},
		{
			name:   "beyond the cap, the models with the fewest devices count as other",
			slices: many,
			want: func() map[string]float64 {
				w := map[string]float64{dev(OtherModel, "free"): 9 * 10 / 2, droppedSeries: 9}
				for i := range MaxModels - 1 {
					w[dev(fmt.Sprintf("m%02d", i), "free")] = float64(40 - i)
				}
				return w
			}(),
			models: func() []string {
				m := []string{OtherModel}
				for i := range MaxModels - 1 {
					m = append(m, fmt.Sprintf("m%02d", i))
				}
				return m
			}(),
		},
		{
			name:   "pending claims by source and age",
			slices: []*resourceapi.ResourceSlice{gpus(driver, "a", 1, "A100")},
			claims: []*resourceapi.ResourceClaim{
				pending("fresh", 10*time.Second, true), pending("late", 20*time.Minute, true), pending("old", 2*time.Hour, true),
				pending("alone", 7*time.Hour, false), allocated("held", "a", "gpu-0"),
			},
			want: map[string]float64{
				dev("A100", "allocated"):  1,
				waiting("template", "0s"): 3, waiting("template", "1m"): 2, waiting("template", "5m"): 2, waiting("template", "15m"): 2, waiting("template", "1h"): 1,
				waiting("standalone", "0s"): 1, waiting("standalone", "1m"): 1, waiting("standalone", "5m"): 1, waiting("standalone", "15m"): 1,
				waiting("standalone", "1h"): 1, waiting("standalone", "6h"): 1,
				oldest("template"): 7200, oldest("standalone"): 7 * 3600,
			},
			models: []string{"A100"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(driver, WithClock(func() time.Time { return now }))
			observe(t, c, tc.slices, tc.claims)
			got := scrape(t, c)
			for k, v := range tc.want {
				if _, ok := got[k]; !ok {
					t.Errorf("no series %s", k)
				} else if got[k] != v {
					t.Errorf("%s = %v, want %v", k, got[k], v)
				}
			}
			gotModels := map[string]bool{}
			for k, v := range got {
				if strings.HasPrefix(k, "gpu_dra_fleet_devices{") {
					gotModels[strings.Split(strings.TrimPrefix(k, `gpu_dra_fleet_devices{model="`), `"`)[0]] = true
				}
				if _, ok := tc.want[k]; !ok && v != 0 {
					t.Errorf("%s = %v, want 0", k, v)
				}
			}
			if len(gotModels) != len(tc.models) {
				t.Errorf("models %v, want %v", gotModels, tc.models)
			}
			for _, m := range tc.models {
				if !gotModels[m] {
					t.Errorf("no series of model %q", m)
				}
			}
			// Every model has each state; every source each age and its oldest.
			if n, want := len(got), len(tc.models)*4+len(sources)*(len(pendingThresholds)+1)+1; n != want {
				t.Errorf("%d series, want %d", n, want)
			}
		})
	}
}

// TestCollectorBeforeObserve: nothing but the dropped counter before a rebuild is observed, and a
// scrape then asks for one.
func TestCollectorBeforeObserve(t *testing.T) {
	refreshed := 0
	c := New(driver, WithRefresh(func() { refreshed++ }))
	got := scrape(t, c)
	if len(got) != 1 || refreshed != 1 {
		t.Errorf("before any rebuild: %v, %d refreshes; want only %s and one refresh", got, refreshed, droppedSeries)
	}
}

// TestCollectorAges: the ages are measured at the scrape, not at the rebuild.
func TestCollectorAges(t *testing.T) {
	clock := now
	c := New(driver, WithClock(func() time.Time { return clock }))
	observe(t, c, []*resourceapi.ResourceSlice{gpus(driver, "a", 1, "A100")}, []*resourceapi.ResourceClaim{pending("p", 14*time.Minute, true)})
	if got := scrape(t, c)[waiting("template", "15m")]; got != 0 {
		t.Errorf("at 14 minutes: %v claims pending for over 15 minutes", got)
	}
	clock = clock.Add(2 * time.Minute)
	got := scrape(t, c)
	if got[waiting("template", "15m")] != 1 || got[oldest("template")] != 16*60 {
		t.Errorf("at 16 minutes: %v over 15 minutes, oldest %vs; want 1 and 960", got[waiting("template", "15m")], got[oldest("template")])
	}
}
