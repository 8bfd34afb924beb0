package deviceusage

import (
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestBusyPoolsOnly: a fleet of busy pools keeps every device of a pool where something may stand
// in a claim's way, exactly as the whole fleet has it, and drops only pools whose devices are all
// free and unhindered.
func TestBusyPoolsOnly(t *testing.T) {
	tainted := gpu("gpu-0", "M")
	tainted.Taints = []resourceapi.DeviceTaint{{Key: "broken", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	shared := gpu("gpu-0", "M")
	shared.AllowMultipleAllocations = ptr.To(true)
	part := func(name, mem string) resourceapi.Device {
		d := gpu(name, "M")
		d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: "c", Counters: map[string]resourceapi.Counter{"memory": {Value: resource.MustParse(mem)}}}}
		return d
	}
	counters := func(node, mem string) *resourceapi.ResourceSlice {
		s := slice("counters-"+node, node)
		s.Spec.SharedCounters = []resourceapi.CounterSet{{Name: "c", Counters: map[string]resourceapi.Counter{"memory": {Value: resource.MustParse(mem)}}}}
		return s
	}
	rule := &resourceapi.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "drain"}, Spec: resourceapi.DeviceTaintRuleSpec{
		DeviceSelector: &resourceapi.DeviceTaintSelector{Pool: ptr.To("ruled")}, Taint: resourceapi.DeviceTaint{Key: "drain", Effect: resourceapi.DeviceTaintEffectNoExecute}}}
	in := Input{
		Slices: []*resourceapi.ResourceSlice{
			slice("quiet", "quiet", gpu("gpu-0", "M"), gpu("gpu-1", "M")),
			slice("held", "held", gpu("gpu-0", "M"), gpu("gpu-1", "M")),
			slice("tainted", "tainted", tainted, gpu("gpu-1", "M")),
			slice("shared", "shared", shared),
			slice("ruled", "ruled", gpu("gpu-0", "M")),
			// A partition that needs more than its GPU has is short of counters with nothing held.
			counters("toobig", "40Gi"), slice("parts-toobig", "toobig", part("whole", "80Gi"), part("half", "40Gi")),
			// Partitions that fit are free while nothing is held.
			counters("fits", "80Gi"), slice("parts-fits", "fits", part("whole", "80Gi"), part("half", "40Gi")),
			// Two slices of one pool: the pool is busy if either is.
			slice("split-a", "split", gpu("gpu-0", "M")), slice("split-b", "split", gpu("gpu-1", "M")),
		},
		Claims:     []*resourceapi.ResourceClaim{claim("c", result("held", "gpu-1")), claim("d", result("split", "gpu-1")), claim("waiting")},
		TaintRules: []*resourceapi.DeviceTaintRule{rule},
	}
	all := Build(in)
	in.BusyPoolsOnly = true
	busy := Build(in)

	var pools []string
	for _, sl := range busy.Slices {
		if !slices.Contains(pools, sl.Spec.Pool.Name) {
			pools = append(pools, sl.Spec.Pool.Name)
		}
	}
	if want := []string{"held", "tainted", "shared", "ruled", "toobig", "split"}; !slices.Equal(pools, want) {
		t.Errorf("busy pools %v, want %v", pools, want)
	}
	for _, d := range all.Devices {
		b := busy.Device(d.ID())
		inBusy := slices.Contains(pools, d.Pool)
		switch {
		case inBusy && b == nil:
			t.Errorf("%s/%s: busy pool, but the device is missing", d.Pool, d.Name)
		case inBusy && (b.State != d.State || b.Healthy != d.Healthy || len(b.Taints) != len(d.Taints) || !slices.Equal(b.CountersShort, d.CountersShort) || len(b.Allocations) != len(d.Allocations)):
			t.Errorf("%s/%s: busy fleet %+v, whole fleet %+v", d.Pool, d.Name, b, d)
		case !inBusy && b != nil:
			t.Errorf("%s/%s: quiet pool, yet in the fleet", d.Pool, d.Name)
		case !inBusy && (d.State != StateFree || !d.Healthy || d.Shared || len(d.Taints) > 0 || len(d.CountersShort) > 0):
			t.Errorf("%s/%s: left out, but the whole fleet has it hindered: %+v", d.Pool, d.Name, d)
		}
	}
	if len(busy.Devices) >= len(all.Devices) {
		t.Errorf("busy fleet has %d devices of %d", len(busy.Devices), len(all.Devices))
	}
	if busy.AllocatedState().AllocatedDevices.Len() != 2 || !slices.Equal(busy.Pending, all.Pending) {
		t.Errorf("allocated %v, pending %v", busy.AllocatedState().AllocatedDevices, busy.Pending)
	}
	if len(busy.CounterSets) != 1 || busy.CounterSets[0].Pool != "toobig" {
		t.Errorf("counter sets %+v, want toobig's", busy.CounterSets)
	}
}

// TestCapacitySharedByShape: devices that publish one capacity map share its values; another
// driver reading the same map finds memory under its own domain.
func TestCapacitySharedByShape(t *testing.T) {
	caps := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{drv + "/memory": {Value: resource.MustParse("80Gi")}, "nic.example.com/memory": {Value: resource.MustParse("1Gi")}}
	a, b := gpu("gpu-0", "M"), gpu("gpu-1", "M")
	a.Capacity, b.Capacity = caps, caps
	other := slice("nic", "n1", resourceapi.Device{Name: "nic-0", Capacity: caps})
	other.Spec.Driver = "nic.example.com"
	f := Build(Input{Slices: []*resourceapi.ResourceSlice{slice("a", "n1", a, b), other}})
	for _, d := range f.Devices {
		want := "80Gi"
		if d.Driver == "nic.example.com" {
			want = "1Gi"
		}
		if d.Memory == nil || d.Memory.String() != want || len(d.Capacity) != 2 {
			t.Errorf("%s: memory %v, capacity %v; want memory %s", d.Name, d.Memory, d.Capacity, want)
		}
	}
}
