package diagnosis

import (
	"runtime"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra/internal/allocs"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility/feasibilitytest"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
)

// heldPerDevice bounds the heap one held state keeps of a busy device, at bigHeld's 40,000
// allocated GPUs, beyond what the last state shares with it: its fleet device, its allocation (with
// the claim it is of, which lets the next state share the device), the allocator's state and its
// share of the index by snapshot device (466 bytes, and some room).
const heldPerDevice = 490

// TestHeldStatePerDeviceBounded: what one held state keeps stays under heldPerDevice bytes a busy
// device. A rebuild publishes its state while the last one is still read, so the webhook holds two.
// It kept 659: a copy of every slice for each state, map entries per device to find devices by ID
// and by snapshot index, and the driver, pool, node and model strings of every device.
func TestHeldStatePerDeviceBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a fleet of 40,000 GPUs")
	}
	view, _, claims := bigHeld(t, time.Minute)
	kept, err := claims.Claims()
	if err != nil {
		t.Fatal(err)
	}
	h := NewHeld(view, fixedClaims(kept))
	// The view's index of the published state is the view's, not the held state's; and the last
	// state stays published while the next one is built.
	last, err := h.build()
	if err != nil {
		t.Fatal(err)
	}
	h.state.Store(last)
	// The claims are the lister's, kept by the informer: the state shares their strings. Each
	// replaced, as by an update the informer saw, so that no device is the last state's.
	replaced := make(fixedClaims, len(kept))
	for i, c := range kept {
		replaced[i] = inventory.KeepClaim(claims.byName[c.Name])
	}
	h.claims = replaced
	st, retained := retainedBuild(t, h)
	if n := len(st.fleet.Devices); n != bigHeldClaims {
		t.Fatalf("the held state has %d devices, want %d", n, bigHeldClaims)
	}
	if per := retained / bigHeldClaims; per > heldPerDevice {
		t.Errorf("a held state keeps %d bytes a busy device, want at most %d", per, heldPerDevice)
	} else {
		t.Logf("a held state keeps %d bytes a busy device", per)
	}
}

// heldSharedPerDevice bounds the heap a held state keeps of a busy device that no claim change
// touched since the last state, whose device and allocation it shares: its place in the fleet's
// list and index, in the allocator's state and in the index by snapshot device (83 bytes, and some room).
const heldSharedPerDevice = 100

// TestHeldRebuildSharesUnchangedDevices: a rebuild after a few claims changed keeps little more
// than the devices of those claims; the rest are the last state's (deviceusage.Input.Previous).
// Each rebuild under claims changing at 100/s kept a whole fleet of its own, heldPerDevice bytes a
// busy device, and made it from 210,000 allocations.
func TestHeldRebuildSharesUnchangedDevices(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a fleet of 40,000 GPUs")
	}
	h, claims, last := builtHeld(t)
	claims.replace(0, churnedClaims)
	st, retained := retainedBuild(t, h)
	remade := 0
	for _, d := range st.fleet.Devices {
		if !slices.Contains(last.fleet.Devices, d) {
			remade++
		}
	}
	if remade != churnedClaims {
		t.Errorf("the rebuild made %d devices, want the %d of the claims replaced", remade, churnedClaims)
	}
	if per := (retained - churnedClaims*heldPerDevice) / bigHeldClaims; per > heldSharedPerDevice {
		t.Errorf("a rebuild after %d claims changed keeps %d bytes a busy device beyond theirs, want at most %d", churnedClaims, per, heldSharedPerDevice)
	} else {
		t.Logf("a rebuild after %d claims changed keeps %d bytes a busy device beyond theirs", churnedClaims, per)
	}
}

// retainedBuild builds a held state of h and returns it with the heap it keeps beyond what h
// holds.
func retainedBuild(t *testing.T, h *Held) (*heldState, int64) {
	t.Helper()
	var st *heldState
	var err error
	retained := allocs.Retained(func() any {
		st, err = h.build()
		return st
	})
	runtime.KeepAlive(h)
	if err != nil {
		t.Fatal(err)
	}
	return st, retained
}

// fixedClaims is a ClaimLister of claims as kept.
type fixedClaims []*inventory.Claim

func (c fixedClaims) Claims() ([]*inventory.Claim, error) { return c, nil }

// TestKeptSlicesShared: a rebuild takes the last state's copy of each slice it was built on too,
// wherever the slice moved in the list, and makes one of each slice that is new or changed.
func TestKeptSlicesShared(t *testing.T) {
	published := inventory.Compact(inventory.NewInterner(), []*resourceapi.ResourceSlice{
		feasibilitytest.GPUSlice("a", 1, feasibilitytest.Fixed("A"), "1Gi"),
		feasibilitytest.GPUSlice("b", 1, feasibilitytest.Fixed("B"), "1Gi"),
		feasibilitytest.GPUSlice("c", 1, feasibilitytest.Fixed("C"), "1Gi"),
	})
	a, b, c := published[0], published[1], published[2]
	first := keptSlices(published, nil, nil)
	for i, sl := range first {
		if sl.Name != published[i].Name || sl.Spec.Pool.Name != published[i].Spec.Pool.Name {
			t.Fatalf("slice %d kept as %s of pool %s, want %s of pool %s", i, sl.Name, sl.Spec.Pool.Name, published[i].Name, published[i].Spec.Pool.Name)
		}
	}
	changed := inventory.Compact(inventory.NewInterner(), []*resourceapi.ResourceSlice{
		feasibilitytest.GPUSlice("b", 2, feasibilitytest.Fixed("B"), "1Gi")})[0]
	for _, tc := range []struct {
		name      string
		published []*inventory.Slice
		// want[i] is the index in first of slice i's copy, -1 for a new one.
		want []int
	}{
		{"unchanged", []*inventory.Slice{a, b, c}, []int{0, 1, 2}},
		{"one gone", []*inventory.Slice{a, c}, []int{0, 2}},
		{"reordered", []*inventory.Slice{c, a, b}, []int{2, 0, 1}},
		{"one changed", []*inventory.Slice{a, changed, c}, []int{0, -1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := keptSlices(tc.published, published, first)
			for i, sl := range got {
				switch w := tc.want[i]; {
				case w >= 0 && sl != first[w]:
					t.Errorf("slice %d: a copy of its own, want the last state's", i)
				case w < 0 && (slices.Contains(first, sl) || len(sl.Spec.Devices) != len(tc.published[i].Spec.Devices)):
					t.Errorf("slice %d: the last state's copy, want one of the changed slice", i)
				}
			}
		})
	}
}

// idlePerDevice bounds what a held state keeps a device when no claim holds any: its share of
// what the state keeps besides the index by snapshot device, which it does not build then.
const idlePerDevice = 3

// TestIdleHeldStateSmall: with no claim allocated the held state keeps next to nothing. It kept a
// copy of every published slice for the next build (54 bytes a device at 8 GPUs a slice), which
// only the slices the fleet holds anyway need, and then an index of every device into an empty
// fleet (4 bytes a device).
func TestIdleHeldStateSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a fleet of 40,000 GPUs")
	}
	view, _, _ := bigHeld(t, time.Minute)
	h := NewHeld(view, fixedClaims(nil))
	// The view's index of the published state is the view's, not the held state's. No state is
	// published: the one measured takes nothing from another.
	if _, err := view.Snapshot(); err != nil {
		t.Fatal(err)
	}
	_, retained := retainedBuild(t, h)
	devices := int64(bigNodes * gpusPerNode)
	if per := retained / devices; per > idlePerDevice {
		t.Errorf("an idle held state keeps %d bytes a device, want at most %d", per, idlePerDevice)
	} else {
		t.Logf("an idle held state keeps %d bytes a device", per)
	}
}
