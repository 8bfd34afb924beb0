// Package feasibilitytest holds the fixtures the tests of the feasibility check and of the
// diagnosis share: a small cluster of three node shapes, and the scheduler's allocator run
// naively on it as the reference the answers are checked against.
package feasibilitytest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
)

// Driver is the driver of the fixtures' GPUs.
const Driver = "gpu.example.com"

// GPUSlice is one node's pool of n GPUs, model(i) the model of GPU i.
func GPUSlice(node string, n int, model func(i int) string, memory string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu"},
		Spec:       resourceapi.ResourceSliceSpec{Driver: Driver, NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}},
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

// Classes are "gpu" (Driver's devices) and "fabric" (fabric.example.com's).
func Classes() []*resourceapi.DeviceClass {
	mk := func(name, d string) *resourceapi.DeviceClass {
		return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", d)}}},
		}}
	}
	return []*resourceapi.DeviceClass{mk("gpu", Driver), mk("fabric", "fabric.example.com")}
}

// Fixed is a model function of GPUSlice giving every GPU model m.
func Fixed(m string) func(int) string { return func(int) string { return m } }

// Cluster: ten nodes of three shapes plus one fabric device every node can reach.
func Cluster() *inventory.Objects {
	st := &inventory.Objects{Classes: Classes()}
	for i := range 10 {
		name := fmt.Sprintf("n%d", i)
		st.Nodes = append(st.Nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
		switch {
		case i == 9:
			st.Slices = append(st.Slices, GPUSlice(name, 4, func(d int) string {
				if d%2 == 0 {
					return "LATEST-GPU-MODEL"
				}
				return "OLD-GPU-MODEL"
			}, "80Gi"))
		case i%2 == 0:
			st.Slices = append(st.Slices, GPUSlice(name, 8, Fixed("LATEST-GPU-MODEL"), "80Gi"))
		default:
			st.Slices = append(st.Slices, GPUSlice(name, 4, Fixed("OLD-GPU-MODEL"), "40Gi"))
		}
	}
	st.Slices = append(st.Slices, &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "fabric"},
		Spec: resourceapi.ResourceSliceSpec{Driver: "fabric.example.com", AllNodes: ptr.To(true), Pool: resourceapi.ResourcePool{Name: "fabric", ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "switch"}}},
	})
	return st
}

// Allocatable asks the allocator on every node with every slice: no grouping, no caching, no
// allocations.
func Allocatable(ctx context.Context, tb testing.TB, st *inventory.Objects, spec *resourceapi.ResourceClaimSpec) bool {
	tb.Helper()
	return AllocatableWith(ctx, tb, st, structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](), AggregatedCapacity: structured.NewConsumedCapacityCollection()}, spec)
}

// AllocatableWith is Allocatable with the given allocations.
func AllocatableWith(ctx context.Context, tb testing.TB, st *inventory.Objects, state structured.AllocatedState, spec *resourceapi.ResourceClaimSpec) bool {
	tb.Helper()
	for _, n := range st.Nodes {
		a, err := structured.NewAllocator(ctx, structured.Features{AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true}, state,
			classLister{"gpu": st.Classes[0], "fabric": st.Classes[1]}, st.Slices, dracel.NewCache(10, dracel.Features{}))
		if err != nil {
			tb.Fatal(err)
		}
		res, err := a.Allocate(ctx, n, []*resourceapi.ResourceClaim{{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default", UID: "c"}, Spec: *spec}})
		if err == nil && len(res) == 1 {
			return true
		}
	}
	return false
}

// classLister serves fixed classes to the allocator.
type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("DeviceClass %q not found", name)
}

// LoadCases reads a table of test cases from testdata/file, refusing unknown fields.
func LoadCases[C any](tb testing.TB, file string) []C {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		tb.Fatal(err)
	}
	var cases []C
	if err := yaml.UnmarshalStrict(data, &cases); err != nil {
		tb.Fatalf("testdata/%s: %v", file, err)
	}
	return cases
}
