package feasibility

import (
	"context"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility/feasibilitytest"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

type claimCase struct {
	Name     string                        `json:"name"`
	Feasible bool                          `json:"feasible"`
	Message  string                        `json:"message"`
	Spec     resourceapi.ResourceClaimSpec `json:"spec"`
}

func TestAgreesWithAllocator(t *testing.T) {
	// The allocator logs every step at V(5); keep the test output readable.
	ctx := context.Background()
	cases := feasibilitytest.LoadCases[claimCase](t, "claims.yaml")
	st := feasibilitytest.Cluster()
	view := New(st, celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema()))
	// A loaded CI machine must not turn a verdict into "unknown".
	view.timeout = time.Minute
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			spec := tc.Spec.DeepCopy()
			resourceversion.Default(spec)
			if got := feasibilitytest.Allocatable(ctx, t, st, spec); got != tc.Feasible {
				t.Fatalf("test data is wrong: the allocator says feasible=%t", got)
			}
			// Twice: the second answer comes from the caches and must not differ.
			for range 2 {
				msg, err := view.Unsatisfiable(ctx, "default", spec)
				if err != nil {
					t.Fatal(err)
				}
				if (msg == "") != tc.Feasible || msg != tc.Message {
					t.Fatalf("view says %q, want %q (feasible=%t)", msg, tc.Message, tc.Feasible)
				}
			}
		})
	}
}

func TestInvalidateSeesNewSlices(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	st := &inventory.Objects{Classes: feasibilitytest.Classes()}
	view := New(st, celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema()))
	spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "g", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu"}}}}}
	resourceversion.Default(spec)
	if msg, _ := view.Unsatisfiable(ctx, "default", spec); msg == "" {
		t.Fatal("empty cluster satisfied a claim")
	}
	st.Slices = append(st.Slices, feasibilitytest.GPUSlice("late", 1, feasibilitytest.Fixed("X"), "1Gi"))
	if msg, _ := view.Unsatisfiable(ctx, "default", spec); msg == "" {
		t.Fatal("view changed without Invalidate: the snapshot is not cached")
	}
	view.Invalidate()
	if msg, _ := view.Unsatisfiable(ctx, "default", spec); msg != "" {
		t.Fatalf("after Invalidate: %s", msg)
	}
	if c, _ := view.DeviceClass("gpu"); c == nil {
		t.Fatal("class gpu not found")
	}
	if c, _ := view.DeviceClass("nope"); c != nil {
		t.Fatal("class nope found")
	}
}
