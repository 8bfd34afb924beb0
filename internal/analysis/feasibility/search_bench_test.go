package feasibility

import (
	"context"
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility/feasibilitytest"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// fleetQuestions are the template shapes the scale harness sends: whole GPUs, 1 to 8, of any
// model, of one model, or with enough memory.
func fleetQuestions() []*resourceapi.ResourceClaimSpec {
	var out []*resourceapi.ResourceClaimSpec
	for _, sel := range []string{
		"",
		`device.attributes["gpu.example.com"].model == "H200-SXM-141GB"`,
		`device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0`,
	} {
		for _, count := range []int64{1, 2, 4, 8} {
			req := resourceapi.ExactDeviceRequest{DeviceClassName: "gpu", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}
			if sel != "" {
				req.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: sel}}}
			}
			spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}}}
			resourceversion.Default(spec)
			out = append(out, spec)
		}
	}
	return out
}

// BenchmarkFirstSearch is what a webhook spends after its start answering the fleet's questions
// once: the index of the published state, then each question searched for the first time; and
// per question, on an index already built.
//
//	go test -run '^$' -bench BenchmarkFirstSearch -benchtime 5x ./internal/analysis/feasibility
func BenchmarkFirstSearch(b *testing.B) {
	const nodes = 5000
	kept := transformed(b, simulatedFleet(b, nodes))
	checker := celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema())
	questions := fleetQuestions()
	ctx := context.Background()
	ask := func(b *testing.B, view *View, spec *resourceapi.ResourceClaimSpec) {
		if msg, err := view.Unsatisfiable(ctx, "default", spec); err != nil || msg != "" {
			b.Fatalf("fleet question unsatisfiable: %q, %v", msg, err)
		}
	}
	fresh := func() *View {
		view := New(kept, checker)
		view.timeout = time.Minute
		return view
	}
	b.Run("start", func(b *testing.B) {
		for b.Loop() {
			view := fresh()
			for _, spec := range questions {
				ask(b, view, spec)
			}
		}
	})
	for i, spec := range questions {
		b.Run(fmt.Sprintf("q%02d", i), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				view := fresh()
				if _, err := view.Snapshot(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				ask(b, view, spec)
			}
		})
	}
}
