package feasibility

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	runtimeapi "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility/feasibilitytest"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// TestInterruptedIsNotCached: a question whose context ends while its selectors are evaluated has no
// verdict, and nothing computed for it is remembered: asked again with time to answer, a claim the
// cluster can satisfy is satisfiable, with or without Invalidate in between. Before, the
// interrupted evaluation was stored as "no device matches" in the view-wide match cache, which
// outlives Invalidate: a permanent wrong denial under deny: [unsatisfiable].
func TestInterruptedIsNotCached(t *testing.T) {
	_, live := ktesting.NewTestContext(t)
	// CEL checks for interruption every 100 iterations of a loop: this one is interrupted when its
	// context has ended.
	loop := "[" + strings.Repeat("0,", 199) + "0].all(i, i == 0)"
	spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "g", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: "gpu",
		Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.example.com"].model == "LATEST-GPU-MODEL" && ` + loop}}},
		Count:           2,
	}}}}}
	resourceversion.Default(spec)

	for name, interrupt := range map[string]func(*View) context.Context{
		"caller cancelled": func(*View) context.Context {
			ctx, cancel := context.WithCancel(live)
			cancel()
			return ctx
		},
		"search timed out": func(v *View) context.Context {
			v.timeout = time.Nanosecond
			return live
		},
	} {
		t.Run(name, func(t *testing.T) {
			view := New(feasibilitytest.Cluster(), celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema()))
			ctx := interrupt(view)
			msg, err := view.Unsatisfiable(ctx, "default", spec)
			if err != nil {
				t.Fatal(err)
			}
			if msg != "" {
				t.Errorf("interrupted: %q, want no verdict", msg)
			}
			view.timeout = time.Minute
			for _, invalidate := range []bool{false, true} {
				if invalidate {
					view.Invalidate()
				}
				if msg, err := view.Unsatisfiable(live, "default", spec); err != nil || msg != "" {
					t.Errorf("asked again (Invalidate: %t): %q (%v), want satisfiable", invalidate, msg, err)
				}
			}
		})
	}
}

// TestCachesKeepNoSpec: verdicts are remembered by a digest of the question, so what the caches
// keep does not grow with the size of the claims asked about (they used to keep each whole spec,
// as JSON, 1024 of them per published state).
func TestCachesKeepNoSpec(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	view := New(feasibilitytest.Cluster(), celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema()))
	view.timeout = time.Minute
	const n, size = 50, 64 << 10
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range n {
		spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "g", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu"}}},
			Config: []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver:     feasibilitytest.Driver,
				Parameters: runtimeapi.RawExtension{Raw: []byte(fmt.Sprintf(`{"n":%d,"pad":%q}`, i, strings.Repeat("x", size)))},
			}}}},
		}}
		resourceversion.Default(spec)
		if msg, err := view.Unsatisfiable(ctx, "default", spec); err != nil || msg != "" {
			t.Fatalf("claim %d: %q (%v), want satisfiable", i, msg, err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if kept := int(after.HeapAlloc) - int(before.HeapAlloc); kept > n*size/4 {
		t.Errorf("the caches keep %d bytes after %d questions about %d-byte claims", kept, n, size)
	}
	runtime.KeepAlive(view)
}

// TestOneSearchPerQuestion: the reviews asking a question nobody asked since the published state
// changed share one search (they each ran their own: at a thousand reviews a second that kept a
// busy webhook saturated), and a review that gives up does not end it: its verdict is there for
// the next.
func TestOneSearchPerQuestion(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	view := New(feasibilitytest.Cluster(), celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema()))
	view.timeout = time.Minute
	// Enough work per device that the askers overlap the search.
	loop := "[" + strings.Repeat("0,", 999) + "0].all(i, i == 0)"
	spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "g", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: "gpu",
		Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.example.com"].model == "NO-SUCH-MODEL" && ` + loop}}},
		Count:           1,
	}}}}}
	resourceversion.Default(spec)
	const askers = 32
	msgs := make([]string, askers)
	var wg sync.WaitGroup
	for i := range askers {
		wg.Go(func() {
			msg, err := view.Unsatisfiable(ctx, "default", spec)
			if err != nil {
				t.Error(err)
			}
			msgs[i] = msg
		})
	}
	wg.Wait()
	for i, msg := range msgs {
		if msg == "" {
			t.Errorf("asker %d: satisfiable, want no device of that model", i)
		}
	}
	s, err := view.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if n := s.verdicts.Searches(); n != 1 {
		t.Errorf("%d searches for %d reviews of one question, want 1", n, askers)
	}

	gone, cancel := context.WithCancel(ctx)
	cancel()
	other := spec.DeepCopy()
	other.Devices.Requests[0].Exactly.Count = 2
	if msg, err := view.Unsatisfiable(gone, "default", other); err != nil || msg != "" {
		t.Errorf("asked by a review already gone: %q (%v), want no verdict", msg, err)
	}
	key := QuestionKey("default", view.Features(ctx, s), other)
	deadline := time.Now().Add(time.Minute)
	for {
		if msg, ok := s.verdicts.Get(*key); ok {
			if msg == "" {
				t.Error("the search of a review that gave up remembered satisfiable")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the search of a review that gave up was not remembered")
		}
		time.Sleep(time.Millisecond)
	}
}
