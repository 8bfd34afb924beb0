package plugin

import (
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// TestResourcesLayout: partitioned GPUs are spread over slices within the API server's limits,
// laid out as the probe found; other modes keep their single slice.
func TestResourcesLayout(t *testing.T) {
	parts := func(count, n int) nodegroups.GroupSpec {
		return nodegroups.GroupSpec{Count: count, Sharing: &nodegroups.Sharing{Mode: nodegroups.Partitioned, Partitions: n}}
	}
	for _, tc := range []struct {
		name   string
		spec   nodegroups.GroupSpec
		layout CounterLayout
		// want is per slice: counter sets and devices.
		want [][2]int
	}{
		{name: "exclusive", spec: nodegroups.GroupSpec{}, layout: CountersWithDevices, want: [][2]int{{0, 8}}},
		{name: "exclusive, 128 GPUs in one slice as always", spec: nodegroups.GroupSpec{Count: 128}, want: [][2]int{{0, 128}}},
		{name: "shared-memory", spec: sharedSpec, want: [][2]int{{0, 8}}},
		{name: "own slices, 8 GPUs of 4", spec: parts(8, 4), want: [][2]int{{8, 0}, {0, 40}}},
		{name: "own slices, 8 GPUs of 16", spec: parts(8, 16), want: [][2]int{{8, 0}, {0, 64}, {0, 64}, {0, 8}}},
		{name: "own slices, 20 GPUs of 2", spec: parts(20, 2), want: [][2]int{{8, 0}, {8, 0}, {4, 0}, {0, 60}}},
		{name: "with devices, 8 GPUs of 4", spec: parts(8, 4), layout: CountersWithDevices, want: [][2]int{{8, 40}}},
		{name: "with devices, 8 GPUs of 16", spec: parts(8, 16), layout: CountersWithDevices, want: [][2]int{{3, 51}, {3, 51}, {2, 34}}},
		{name: "with devices, 20 GPUs of 1", spec: parts(20, 1), layout: CountersWithDevices, want: [][2]int{{8, 16}, {8, 16}, {4, 8}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			res, err := Resources(ctx, testNode, simulated.New(testNode, tc.spec), tc.layout)
			if err != nil {
				t.Fatal(err)
			}
			slices := res.Pools[testNode].Slices
			var got [][2]int
			sets := map[string]int{}
			for i, s := range slices {
				got = append(got, [2]int{len(s.SharedCounters), len(s.Devices)})
				for _, set := range s.SharedCounters {
					sets[set.Name] = i
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("slices (counter sets, devices) %v, want %v", got, tc.want)
			}
			seen := map[string]bool{}
			for i, s := range slices {
				for _, d := range s.Devices {
					if seen[d.Name] {
						t.Errorf("device %s published twice", d.Name)
					}
					seen[d.Name] = true
					for _, c := range d.ConsumesCounters {
						where, ok := sets[c.CounterSet]
						if !ok || (tc.layout == CountersWithDevices && where != i) {
							t.Errorf("%s in slice %d consumes %s, published in slice %d (%v)", d.Name, i, c.CounterSet, where, ok)
						}
					}
				}
			}
		})
	}
}

func TestSlicesWithCountersRefusesWhatNoSliceHolds(t *testing.T) {
	sets := []resourceapi.CounterSet{{Name: "a"}, {Name: "b"}}
	consume := func(name string, sets ...string) resourceapi.Device {
		d := resourceapi.Device{Name: name}
		for _, s := range sets {
			d.ConsumesCounters = append(d.ConsumesCounters, resourceapi.DeviceCounterConsumption{CounterSet: s})
		}
		return d
	}
	for _, tc := range []struct {
		devices []resourceapi.Device
		want    string
	}{
		{[]resourceapi.Device{consume("x", "a", "b")}, "device x consumes counter sets a and b: one slice cannot hold both with their other devices"},
		{[]resourceapi.Device{consume("x", "c")}, "device x consumes counter set c, which the node does not publish"},
	} {
		if _, err := slicesWithCounters(sets, tc.devices); err == nil || err.Error() != tc.want {
			t.Errorf("slicesWithCounters = %v, want %s", err, tc.want)
		}
	}
	var many []resourceapi.Device
	for i := range 65 {
		many = append(many, consume(fmt.Sprint(i), "a"))
	}
	if _, err := slicesWithCounters(sets, many); err == nil || err.Error() != "counter set a: 65 devices consume it, more than the 64 one slice may hold" {
		t.Errorf("65 devices of one set: %v", err)
	}
}
