package feasibility

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

const driver = "gpu.example.com"

func gpuSlice(node string, n int, model func(i int) string, memory string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu"},
		Spec:       resourceapi.ResourceSliceSpec{Driver: driver, NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}},
	}
	for i := range n {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				deviceschema.AttrIndex:         {IntValue: ptr.To(int64(i))},
				deviceschema.AttrUUID:          {StringValue: ptr.To(fmt.Sprintf("gpu-%s-%d", node, i))},
				deviceschema.AttrModel:         {StringValue: ptr.To(model(i))},
				deviceschema.AttrDriverVersion: {VersionValue: ptr.To("1.0.0")},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{deviceschema.CapMemory: {Value: resource.MustParse(memory)}},
		})
	}
	return s
}

func classes() []*resourceapi.DeviceClass {
	mk := func(name, d string) *resourceapi.DeviceClass {
		return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", d)}}},
		}}
	}
	return []*resourceapi.DeviceClass{mk("gpu", driver), mk("fabric", "fabric.example.com")}
}

func fixed(m string) func(int) string { return func(int) string { return m } }

// testCluster: ten nodes of three shapes plus one fabric device every node can reach.
func testCluster() *inventory.Objects {
	st := &inventory.Objects{Classes: classes()}
	for i := range 10 {
		name := fmt.Sprintf("n%d", i)
		st.Nodes = append(st.Nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
		switch {
		case i == 9:
			st.Slices = append(st.Slices, gpuSlice(name, 4, func(d int) string {
				if d%2 == 0 {
					return "LATEST-GPU-MODEL"
				}
				return "OLD-GPU-MODEL"
			}, "80Gi"))
		case i%2 == 0:
			st.Slices = append(st.Slices, gpuSlice(name, 8, fixed("LATEST-GPU-MODEL"), "80Gi"))
		default:
			st.Slices = append(st.Slices, gpuSlice(name, 4, fixed("OLD-GPU-MODEL"), "40Gi"))
		}
	}
	st.Slices = append(st.Slices, &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "fabric"},
		Spec: resourceapi.ResourceSliceSpec{Driver: "fabric.example.com", AllNodes: ptr.To(true), Pool: resourceapi.ResourcePool{Name: "fabric", ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "switch"}}},
	})
	return st
}

type claimCase struct {
	Name     string                        `json:"name"`
	Feasible bool                          `json:"feasible"`
	Message  string                        `json:"message"`
	Spec     resourceapi.ResourceClaimSpec `json:"spec"`
}

// naive asks the allocator on every node with every slice: no grouping, no caching, no allocations.
func naive(ctx context.Context, t *testing.T, st *inventory.Objects, spec *resourceapi.ResourceClaimSpec) bool {
	t.Helper()
	return naiveWith(ctx, t, st, structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](), AggregatedCapacity: structured.NewConsumedCapacityCollection()}, spec)
}

// naiveWith is naive with the given allocations.
func naiveWith(ctx context.Context, t *testing.T, st *inventory.Objects, state structured.AllocatedState, spec *resourceapi.ResourceClaimSpec) bool {
	t.Helper()
	for _, n := range st.Nodes {
		a, err := structured.NewAllocator(ctx, structured.Features{AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true}, state,
			classLister{s: &snapshot{classes: map[string]*resourceapi.DeviceClass{"gpu": st.Classes[0], "fabric": st.Classes[1]}}}, st.Slices, dracel.NewCache(10, dracel.Features{}))
		if err != nil {
			t.Fatal(err)
		}
		res, err := a.Allocate(ctx, n, []*resourceapi.ResourceClaim{{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default", UID: "c"}, Spec: *spec}})
		if err == nil && len(res) == 1 {
			return true
		}
	}
	return false
}

func TestAgreesWithAllocator(t *testing.T) {
	// The allocator logs every step at V(5); keep the test output readable.
	ctx := context.Background()
	cases := loadCases[claimCase](t, "claims.yaml")
	st := testCluster()
	view := New(st, celcheck.New(driver, deviceschema.DeviceSchema()))
	// A loaded CI machine must not turn a verdict into "unknown".
	view.timeout = time.Minute
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			spec := tc.Spec.DeepCopy()
			resourceversion.Default(spec)
			if got := naive(ctx, t, st, spec); got != tc.Feasible {
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
	st := &inventory.Objects{Classes: classes()}
	view := New(st, celcheck.New(driver, deviceschema.DeviceSchema()))
	spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "g", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu"}}}}}
	resourceversion.Default(spec)
	if msg, _ := view.Unsatisfiable(ctx, "default", spec); msg == "" {
		t.Fatal("empty cluster satisfied a claim")
	}
	st.Slices = append(st.Slices, gpuSlice("late", 1, fixed("X"), "1Gi"))
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
