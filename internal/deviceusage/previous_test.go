package deviceusage

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// previousInput is a fleet's input as a cache keeps it: slices and claims that are replaced, never
// modified, when they change.
type previousInput struct {
	slices []*resourceapi.ResourceSlice
	claims map[string]*Claim
}

func (in previousInput) input(prev *Fleet) Input {
	kept := make([]*Claim, 0, len(in.claims))
	for _, c := range in.claims {
		kept = append(kept, c)
	}
	return Input{Slices: in.slices, Kept: kept, BusyPoolsOnly: true, Previous: prev}
}

func (in previousInput) clone() previousInput {
	claims := make(map[string]*Claim, len(in.claims))
	for n, c := range in.claims {
		claims[n] = c
	}
	return previousInput{slices: slices.Clone(in.slices), claims: claims}
}

func (in previousInput) put(c *resourceapi.ResourceClaim) { in.claims[c.Name] = ClaimOf(c) }

// previousFleet: n1 and n2 of plain GPUs, n3 with a shared GPU, n4 with two partitions of one
// GPU's memory; every pool has something allocated.
func previousFleet() previousInput {
	sharedGPU := gpu("gpu-0", "M")
	sharedGPU.AllowMultipleAllocations = ptr.To(true)
	partition := func(name string) resourceapi.Device {
		d := gpu(name, "M")
		d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: "gpu-0-counters",
			Counters: map[string]resourceapi.Counter{"memory": {Value: resource.MustParse("60Gi")}}}}
		return d
	}
	partitioned := slice("d", "n4", partition("gpu-0-a"), partition("gpu-0-b"))
	partitioned.Spec.SharedCounters = []resourceapi.CounterSet{{Name: "gpu-0-counters",
		Counters: map[string]resourceapi.Counter{"memory": {Value: resource.MustParse("80Gi")}}}}
	in := previousInput{
		slices: []*resourceapi.ResourceSlice{
			slice("a", "n1", gpu("gpu-0", "M"), gpu("gpu-1", "M"), gpu("gpu-2", "M")),
			slice("b", "n2", gpu("gpu-0", "M"), gpu("gpu-1", "M")),
			slice("c", "n3", sharedGPU),
			partitioned,
		},
		claims: map[string]*Claim{},
	}
	in.put(claim("a0", result("n1", "gpu-0")))
	in.put(claim("a1", result("n1", "gpu-1")))
	in.put(claim("b0", result("n2", "gpu-0")))
	in.put(claim("s1", shareOf("n3", "gpu-0", "1")))
	in.put(claim("p", result("n4", "gpu-0-a")))
	in.put(claim("waiting"))
	return in
}

func shareOf(pool, device, id string) resourceapi.DeviceRequestAllocationResult {
	r := result(pool, device)
	r.ShareID = ptr.To(types.UID(id))
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi")}
	return r
}

// TestBuildKeepsUnchangedDevices: a fleet built with Previous is the fleet built without it, and
// takes from Previous exactly the devices whose slice, claims and counters did not change,
// leaving Previous as it was.
func TestBuildKeepsUnchangedDevices(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(in previousInput)
		// remade are the devices (node/name) the change must make anew: those of n4, which
		// consume counters, always.
		remade []string
	}{
		{name: "nothing", change: func(previousInput) {}},
		{name: "a claim replaced by an equal one", change: func(in previousInput) { in.put(claim("a1", result("n1", "gpu-1"))) },
			remade: []string{"n1/gpu-1"}},
		{name: "a claim deleted", change: func(in previousInput) { delete(in.claims, "a0") }, remade: []string{"n1/gpu-0"}},
		{name: "a claim moved", change: func(in previousInput) { in.put(claim("a0", result("n1", "gpu-2"))) },
			remade: []string{"n1/gpu-0", "n1/gpu-2"}},
		{name: "a claim added before the others", change: func(in previousInput) { in.put(claim("0", result("n2", "gpu-1"))) },
			remade: []string{"n2/gpu-1"}},
		{name: "a second share", change: func(in previousInput) { in.put(claim("s2", shareOf("n3", "gpu-0", "2"))) },
			remade: []string{"n3/gpu-0"}},
		{name: "a slice republished", change: func(in previousInput) { in.slices[1] = in.slices[1].DeepCopy() },
			remade: []string{"n2/gpu-0", "n2/gpu-1"}},
		{name: "the last claim of a pool deleted", change: func(in previousInput) { delete(in.claims, "b0") }},
		{name: "a waiting claim allocated", change: func(in previousInput) { in.put(claim("waiting", result("n4", "gpu-0-b"))) }},
		{name: "a claim of a device no slice publishes", change: func(in previousInput) { in.put(claim("gone", result("n9", "gpu-0"))) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := previousFleet()
			prev := Build(before.input(nil))
			prevJSON := mustJSON(t, prev)
			after := before.clone()
			tc.change(after)
			got := Build(after.input(prev))
			want := Build(after.input(nil))
			if g, w := mustJSON(t, got), mustJSON(t, want); g != w {
				t.Errorf("built with Previous:\n%s\nwithout:\n%s", g, w)
			}
			if !reflect.DeepEqual(got.AllocatedState(), want.AllocatedState()) {
				t.Errorf("allocated state %+v, want %+v", got.AllocatedState(), want.AllocatedState())
			}
			if mustJSON(t, prev) != prevJSON {
				t.Errorf("Previous modified:\n%s\nwas:\n%s", mustJSON(t, prev), prevJSON)
			}
			remade := append([]string{"n4/gpu-0-a", "n4/gpu-0-b"}, tc.remade...)
			for _, d := range got.Devices {
				key := d.Node + "/" + d.Name
				kept := slices.Contains(prev.Devices, d)
				if wantKept := !slices.Contains(remade, key) && prev.Device(d.ID()) != nil; kept != wantKept {
					t.Errorf("device %s taken from Previous: %t, want %t", key, kept, wantKept)
				}
			}
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
