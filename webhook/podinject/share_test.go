package podinject

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

type classList []*resourceapi.DeviceClass

func (l classList) List() ([]*resourceapi.DeviceClass, error) { return l, nil }
func (l classList) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, nil
}

// TestMemoryShareTemplate runs the scheduler's allocator, with consumable capacity, on the
// template of a memory share against what the simulated driver publishes: on shared-memory GPUs
// two pods' claims get shares of one GPU with the memory asked and the least compute; on
// exclusive GPUs the claim gets a whole GPU with at least the memory, as the selector always gave.
func TestMemoryShareTemplate(t *testing.T) {
	ctx := context.Background()
	o, err := newOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	mem := resource.MustParse("10Gi")
	tmpl, err := o.template("ns", Request{Count: 1, Memory: &mem, MemoryShare: true})
	if err != nil {
		t.Fatal(err)
	}
	classes := classList{{ObjectMeta: metav1.ObjectMeta{Name: o.classes[0].Name}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}}}}}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	slice := func(spec nodegroups.GroupSpec) *resourceapi.ResourceSlice {
		devices, err := simulated.New("n", spec).Devices(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: resourceapi.ResourceSliceSpec{
			Driver: "gpu.example.com", NodeName: ptr.To("n"), Pool: resourceapi.ResourcePool{Name: "n", ResourceSliceCount: 1}, Devices: devices}}
	}
	features := structured.Features{AdminAccess: true, PrioritizedList: true, DeviceTaints: true, ConsumableCapacity: true}
	allocate := func(sl *resourceapi.ResourceSlice, state structured.AllocatedState, uid string) resourceapi.DeviceRequestAllocationResult {
		t.Helper()
		a, err := structured.NewAllocator(ctx, features, state, classes, []*resourceapi.ResourceSlice{sl}, dracel.NewCache(10, dracel.Features{EnableConsumableCapacity: true}))
		if err != nil {
			t.Fatal(err)
		}
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: uid, Namespace: "ns", UID: types.UID(uid)}, Spec: tmpl.Spec.Spec}
		res, err := a.Allocate(ctx, node, []*resourceapi.ResourceClaim{claim})
		if err != nil || len(res) != 1 || len(res[0].Devices.Results) != 1 {
			t.Fatalf("allocate %s: %+v, %v", uid, res, err)
		}
		return res[0].Devices.Results[0]
	}
	empty := func() structured.AllocatedState {
		return structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](), AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
			AggregatedCapacity: structured.NewConsumedCapacityCollection()}
	}

	shared := slice(nodegroups.GroupSpec{Count: 1, Sharing: &nodegroups.Sharing{Mode: nodegroups.SharedMemory}})
	state := empty()
	var first resourceapi.DeviceRequestAllocationResult
	for i, uid := range []string{"pod-a", "pod-b"} {
		r := allocate(shared, state, uid)
		if r.Request != RequestName+"/"+shareSubRequest || r.ShareID == nil || !r.ConsumedCapacity["memory"].Equal(mem) || !r.ConsumedCapacity["compute"].Equal(resource.MustParse("1")) {
			t.Fatalf("%s on a shared GPU: %+v, want a share of 10Gi and 1 compute", uid, r)
		}
		if i == 1 && (r.Device != first.Device || *r.ShareID == *first.ShareID) {
			t.Errorf("two shares: %s/%s and %s/%s, want one GPU, two share IDs", first.Device, *first.ShareID, r.Device, *r.ShareID)
		}
		first = r
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
	}

	small, big := resource.MustParse("8Gi"), resource.MustParse("16Gi")
	if r := allocate(slice(nodegroups.GroupSpec{Count: 2, Memory: &big}), empty(), "pod-c"); r.Request != RequestName+"/"+wholeSubRequest || r.ShareID != nil {
		t.Errorf("on exclusive GPUs: %+v, want a whole GPU", r)
	}
	a, err := structured.NewAllocator(ctx, features, empty(), classes, []*resourceapi.ResourceSlice{slice(nodegroups.GroupSpec{Count: 2, Memory: &small})},
		dracel.NewCache(10, dracel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := a.Allocate(ctx, node, []*resourceapi.ResourceClaim{{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "ns", UID: "d"}, Spec: tmpl.Spec.Spec}}); err != nil || len(res) != 0 {
		t.Errorf("8Gi exclusive GPUs for a 10Gi pod: %+v, %v; want none", res, err)
	}
}
