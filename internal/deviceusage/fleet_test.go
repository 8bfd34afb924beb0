package deviceusage

import (
	"fmt"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

const drv = "gpu.example.com"

func slice(name, node string, devices ...resourceapi.Device) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{Driver: drv, Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}, Devices: devices}}
	if node != "" {
		s.Spec.NodeName = ptr.To(node)
	}
	return s
}

func gpu(name, model string) resourceapi.Device {
	return resourceapi.Device{Name: name,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"model": {StringValue: ptr.To(model)}},
		Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("80Gi")}}}
}

func claim(name string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
	if len(results) > 0 {
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	}
	return c
}

func result(pool, device string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: drv, Pool: pool, Device: device}
}

func TestTaintRules(t *testing.T) {
	slices_ := []*resourceapi.ResourceSlice{slice("a", "n1", gpu("gpu-0", "M"), gpu("gpu-1", "M")), slice("b", "n2", gpu("gpu-0", "M"))}
	rule := func(name string, sel *resourceapi.DeviceTaintSelector) *resourceapi.DeviceTaintRule {
		return &resourceapi.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.DeviceTaintRuleSpec{DeviceSelector: sel, Taint: resourceapi.DeviceTaint{Key: name, Effect: resourceapi.DeviceTaintEffectNoSchedule}}}
	}
	for _, tc := range []struct {
		name string
		rule *resourceapi.DeviceTaintRule
		// tainted lists node/device.
		tainted []string
	}{
		{"no selector matches nothing", rule("none", nil), nil},
		{"empty selector matches everything", rule("all", &resourceapi.DeviceTaintSelector{}), []string{"n1/gpu-0", "n1/gpu-1", "n2/gpu-0"}},
		{"by pool", rule("pool", &resourceapi.DeviceTaintSelector{Pool: ptr.To("n1")}), []string{"n1/gpu-0", "n1/gpu-1"}},
		{"by device name", rule("device", &resourceapi.DeviceTaintSelector{Device: ptr.To("gpu-0")}), []string{"n1/gpu-0", "n2/gpu-0"}},
		{"other driver", rule("driver", &resourceapi.DeviceTaintSelector{Driver: ptr.To("nic.example.com")}), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Build(Input{Slices: slices_, TaintRules: []*resourceapi.DeviceTaintRule{tc.rule}})
			var tainted []string
			for _, d := range f.Devices {
				if len(d.Taints) > 0 {
					tainted = append(tainted, d.Node+"/"+d.Name)
					if d.Taints[0].Rule != tc.rule.Name || d.Healthy {
						t.Errorf("%s/%s: taints %+v healthy %t", d.Node, d.Name, d.Taints, d.Healthy)
					}
				}
			}
			if !slices.Equal(tainted, tc.tainted) {
				t.Errorf("tainted %v, want %v", tainted, tc.tainted)
			}
			for _, s := range slices_ {
				for _, d := range s.Spec.Devices {
					if len(d.Taints) > 0 {
						t.Fatalf("input slice %s was modified", s.Name)
					}
				}
			}
		})
	}
}

// TestAllocatedState: the state handed to the allocator is the scheduler's (dynamicresources'
// foreachAllocatedDevice): admin access holds nothing, a share is a shared ID with its capacity.
func TestAllocatedState(t *testing.T) {
	shared := gpu("gpu-1", "M")
	shared.AllowMultipleAllocations = ptr.To(true)
	share := func(id string, mem string) resourceapi.DeviceRequestAllocationResult {
		r := result("n1", "gpu-1")
		r.ShareID = ptr.To(types.UID(id))
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(mem)}
		return r
	}
	admin := result("n1", "gpu-2")
	admin.AdminAccess = ptr.To(true)
	f := Build(Input{
		Slices: []*resourceapi.ResourceSlice{slice("a", "n1", gpu("gpu-0", "M"), shared, gpu("gpu-2", "M"))},
		Claims: []*resourceapi.ResourceClaim{claim("held", result("n1", "gpu-0")), claim("s1", share("1", "10Gi")), claim("s2", share("2", "30Gi")),
			claim("watch", admin), claim("gone", result("n9", "gpu-0")), claim("waiting")},
	})
	st := f.AllocatedState()
	if !st.AllocatedDevices.Equal(sets.New(structured.MakeDeviceID(drv, "n1", "gpu-0"), structured.MakeDeviceID(drv, "n9", "gpu-0"))) {
		t.Errorf("allocated devices %v", st.AllocatedDevices)
	}
	if st.AllocatedSharedDeviceIDs.Len() != 2 {
		t.Errorf("shared IDs %v", st.AllocatedSharedDeviceIDs)
	}
	if got := st.AggregatedCapacity[structured.MakeDeviceID(drv, "n1", "gpu-1")]["memory"]; got == nil || got.String() != "40Gi" {
		t.Errorf("aggregated capacity of gpu-1: %v", got)
	}
	states := map[string]State{}
	for _, d := range f.Devices {
		states[d.Name] = d.State
	}
	if want := map[string]State{"gpu-0": StateAllocated, "gpu-1": StateShared, "gpu-2": StateFree}; fmt.Sprint(states) != fmt.Sprint(want) {
		t.Errorf("states %v, want %v", states, want)
	}
	if len(f.Unpublished) != 1 || f.Unpublished[0].Claim != "ns/gone" || !slices.Equal(f.Pending, []string{"ns/waiting"}) {
		t.Errorf("unpublished %+v, pending %v", f.Unpublished, f.Pending)
	}
}

// TestCounters: held partitions use their counter set; a device that no longer fits is blocked,
// one that does stays free, and a shared device consumes its counters once.
func TestCounters(t *testing.T) {
	part := func(name, mem string) resourceapi.Device {
		d := gpu(name, "M")
		d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: "c", Counters: map[string]resourceapi.Counter{"memory": {Value: resource.MustParse(mem)}}}}
		return d
	}
	counters := slice("counters", "n1")
	counters.Spec.SharedCounters = []resourceapi.CounterSet{{Name: "c", Counters: map[string]resourceapi.Counter{"memory": {Value: resource.MustParse("80Gi")}}}}
	f := Build(Input{
		Slices: []*resourceapi.ResourceSlice{counters, slice("parts", "n1", part("whole", "80Gi"), part("half-0", "40Gi"), part("half-1", "40Gi"), part("quarter", "20Gi"))},
		Claims: []*resourceapi.ResourceClaim{claim("q", result("n1", "quarter"))},
	})
	got := map[string]State{}
	for _, d := range f.Devices {
		got[d.Name] = d.State
	}
	want := map[string]State{"whole": StateBlocked, "half-0": StateFree, "half-1": StateFree, "quarter": StateAllocated}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("states %v, want %v", got, want)
	}
	if u := f.CounterSets[0].Counters["memory"]; u.Used.String() != "20Gi" {
		t.Errorf("used %s, want 20Gi", u.Used.String())
	}
	rep := f.Report(Selection{})
	if len(rep.Totals) != 1 || rep.Totals[0].Blocked != 1 || rep.Totals[0].Free != 2 || rep.Totals[0].Allocated != 1 {
		t.Errorf("totals %+v", rep.Totals)
	}
}

// TestSelection: devices of other nodes' slices are left out; a slice that selects nodes by label
// is shown for the nodes it selects.
func TestSelection(t *testing.T) {
	labelled := slice("fabric", "", gpu("switch", "S"))
	labelled.Spec.NodeSelector = &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{
		{Key: "rack", Operator: v1.NodeSelectorOpIn, Values: []string{"r1"}}}}}}
	f := Build(Input{Slices: []*resourceapi.ResourceSlice{slice("a", "n1", gpu("gpu-0", "M")), slice("b", "n2", gpu("gpu-0", "M")), labelled}})
	node := func(name, rack string) *v1.Node {
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"rack": rack}}}
	}
	for _, tc := range []struct {
		nodes []*v1.Node
		want  []string
	}{
		{nil, []string{"<selected nodes>", "n1", "n2"}},
		{[]*v1.Node{node("n1", "r1")}, []string{"<selected nodes>", "n1"}},
		{[]*v1.Node{node("n2", "r2")}, []string{"n2"}},
		{[]*v1.Node{}, nil},
	} {
		var got []string
		for _, n := range f.Report(Selection{Driver: drv, Nodes: tc.nodes}).Nodes {
			got = append(got, n.Name)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("nodes %v: report lists %v, want %v", tc.nodes, got, tc.want)
		}
	}
}

// TestCapacitiesShared: devices whose capacity maps are equal but their own (as a list decodes
// them, one per device) share one copy of the values, which print as published; a device with
// other capacities, or the same value written otherwise, gets its own.
func TestCapacitiesShared(t *testing.T) {
	other := gpu("gpu-2", "A")
	other.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("40Gi")}}
	spelled := gpu("gpu-3", "A")
	spelled.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("85899345920")}}
	f := Build(Input{Slices: []*resourceapi.ResourceSlice{
		slice("a", "node-a", gpu("gpu-0", "A"), gpu("gpu-1", "A"), other, spelled),
		slice("b", "node-b", gpu("gpu-0", "A")),
	}})
	if len(f.Devices) != 5 {
		t.Fatalf("%d devices, want 5", len(f.Devices))
	}
	byName := map[string]*Device{}
	for _, d := range f.Devices {
		byName[d.Node+"/"+d.Name] = d
	}
	first := byName["node-a/gpu-0"]
	for _, name := range []string{"node-a/gpu-1", "node-b/gpu-0"} {
		if d := byName[name]; fmt.Sprintf("%p", d.Capacity) != fmt.Sprintf("%p", first.Capacity) || d.Memory != first.Memory {
			t.Errorf("%s: capacities not shared with node-a/gpu-0's equal ones", name)
		}
	}
	for name, want := range map[string]string{"node-a/gpu-0": "80Gi", "node-a/gpu-2": "40Gi", "node-a/gpu-3": "85899345920"} {
		if got := byName[name].Memory.String(); got != want {
			t.Errorf("%s: memory %s, want %s as published", name, got, want)
		}
	}
}

// TestDeviceLookup: Device finds each device by its ID whatever the order of nodes, pools and
// names, and of two slices publishing one device the first, as the allocator does.
func TestDeviceLookup(t *testing.T) {
	inPool := func(pool string, s *resourceapi.ResourceSlice) *resourceapi.ResourceSlice {
		s.Spec.Pool.Name = pool
		return s
	}
	fl := Build(Input{Slices: []*resourceapi.ResourceSlice{
		// Pools named otherwise than their nodes, devices not in order of their names.
		inPool("z-pool", slice("s-z", "a-node", gpu("gpu-2", "M"), gpu("gpu-1", "first"), gpu("gpu-0", "M"))),
		inPool("a-pool", slice("s-a", "b-node", gpu("gpu-0", "M"))),
		inPool("z-pool", slice("s-y", "a-node", gpu("gpu-1", "second"), gpu("gpu-3", "M"))),
	}})
	for _, tc := range []struct {
		pool, name string
		// model is the model of the device found, "" for none.
		model string
	}{
		{"z-pool", "gpu-0", "M"}, {"z-pool", "gpu-1", "first"}, {"z-pool", "gpu-2", "M"}, {"z-pool", "gpu-3", "M"},
		{"a-pool", "gpu-0", "M"},
		{"a-pool", "gpu-1", ""}, {"a-node", "gpu-0", ""}, {"b-node", "gpu-0", ""},
	} {
		d := fl.Device(structured.MakeDeviceID(drv, tc.pool, tc.name))
		switch {
		case tc.model == "" && d != nil:
			t.Errorf("%s/%s: found %s/%s, want none", tc.pool, tc.name, d.Pool, d.Name)
		case tc.model != "" && (d == nil || d.Pool != tc.pool || d.Name != tc.name || d.Model != tc.model):
			t.Errorf("%s/%s: found %+v, want the device of model %s", tc.pool, tc.name, d, tc.model)
		}
	}
}
