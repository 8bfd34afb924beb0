package plugin

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// partitionedSpec is a node group of GPUs cut in 4 partitions (20Gi and 25 compute each).
var partitionedSpec = nodegroups.GroupSpec{Sharing: &nodegroups.Sharing{Mode: nodegroups.Partitioned, Partitions: 4}}

func newPartitionedHarness(t testing.TB) *harness {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	h := newHarness(t)
	if err := h.driver.SetDevices(ctx, simulated.New(testNode, partitionedSpec)); err != nil {
		t.Fatal(err)
	}
	return h
}

func TestPreparePartitions(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	h := newPartitionedHarness(t)
	a := claim("uid-a", "a", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0-partition-1")})
	b := claim("uid-b", "b", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0-partition-2")})
	res, err := h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{a, b})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*resourceapi.ResourceClaim{a, b} {
		if r := res[c.UID]; r.Err != nil || len(r.Devices) != 1 || r.Devices[0].ShareID != nil {
			t.Fatalf("claim %s: %+v", c.Name, r)
		}
	}
	spec, err := h.cdi.Spec(mustEntry(t, h, a.UID))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"GPU_DEVICE_0_PARTITION_1=gpu-0-partition-1", "GPU_DEVICE_0_PARTITION_1_RESOURCE_CLAIM=uid-a",
		"GPU_DEVICE_0_PARTITION_1_SHARING_STRATEGY=TimeSlicing", "GPU_DEVICE_0_PARTITION_1_TIMESLICE_INTERVAL=Default",
		"GPU_DEVICE_0_PARTITION_1_MEMORY=20Gi", "GPU_DEVICE_0_PARTITION_1_COMPUTE=25", "DRA_ADMIN_ACCESS=false"}
	if got := spec.Devices[0].ContainerEdits.Env; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("env %v\nwant %v", got, want)
	}

	// The whole GPU overlaps both partitions; on another GPU it does not.
	full := claim("uid-f", "f", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0-full")})
	res, _ = h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{full})
	wantErr := "claim ns/f: device node-a/gpu-0-full needs compute 100 of counter set gpu-0-counters, which has 100 beside the devices prepared (ns/a gpu-0-partition-1 25, ns/b gpu-0-partition-2 25); unprepare one of them first"
	if err := res[full.UID].Err; err == nil || err.Error() != wantErr {
		t.Errorf("whole GPU beside its partitions: %v\nwant %s", err, wantErr)
	}
	other := claim("uid-o", "o", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-1-full")})
	res, _ = h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{other})
	if err := res[other.UID].Err; err != nil {
		t.Fatalf("whole GPU 1: %v", err)
	}
	spec, err = h.cdi.Spec(mustEntry(t, h, other.UID))
	if err != nil {
		t.Fatal(err)
	}
	env := strings.Join(spec.Devices[0].ContainerEdits.Env, "\n") + "\n"
	for _, want := range []string{"GPU_DEVICE_1_FULL=gpu-1-full\n", "GPU_DEVICE_1_FULL_MEMORY=80Gi\n", "GPU_DEVICE_1_FULL_COMPUTE=100\n"} {
		if !strings.Contains(env, want) {
			t.Errorf("whole GPU env lacks %s%s", want, env)
		}
	}
	// And the reverse: a partition of a GPU held whole.
	part := claim("uid-p", "p", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-1-partition-0")})
	res, _ = h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{part})
	if err := res[part.UID].Err; err == nil || !strings.Contains(err.Error(), "device node-a/gpu-1-partition-0 needs compute 25 of counter set gpu-1-counters, which has 100 beside the devices prepared (ns/o gpu-1-full 100)") {
		t.Errorf("partition of a GPU held whole: %v", err)
	}
	// One claim asking for a partition and the whole of one GPU is refused too.
	both := claim("uid-2", "two", []resourceapi.DeviceRequestAllocationResult{result("x", "gpu-2-partition-3"), result("y", "gpu-2-full")})
	res, _ = h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{both})
	if err := res[both.UID].Err; err == nil || !strings.Contains(err.Error(), "(ns/two gpu-2-partition-3 25)") {
		t.Errorf("partition and whole GPU in one claim: %v", err)
	}

	// Releasing the partitions frees the GPU.
	if _, err := h.driver.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: a.UID}, {UID: b.UID}}); err != nil {
		t.Fatal(err)
	}
	res, _ = h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{full})
	if err := res[full.UID].Err; err != nil {
		t.Errorf("whole GPU after its partitions were released: %v", err)
	}
}

// TestPartitionsRecoverFromSpecs: a lost checkpoint is rebuilt from the CDI specs with the
// partition names and sizes, so the guard still counts the counters they hold.
func TestPartitionsRecoverFromSpecs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	h := newPartitionedHarness(t)
	a := claim("uid-a", "a", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-3-partition-0")})
	b := claim("uid-b", "b", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-4-full")})
	r, after := rebuildFromSpecs(t, h, partitionedSpec, a, b)
	if d := after[a.UID].Devices[0]; d.Device != "gpu-3-partition-0" || d.Index != 3 || !d.Capacity["memory"].Equal(resource.MustParse("20Gi")) {
		t.Errorf("rebuilt partition of a: %+v", d)
	}
	for _, c := range []*resourceapi.ResourceClaim{
		claim("uid-c", "c", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-3-full")}),
		claim("uid-d", "d", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-4-partition-2")}),
	} {
		res, _ := r.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
		if res[c.UID].Err == nil {
			t.Errorf("claim %s overlapping a prepared device was prepared after the rebuild", c.Name)
		}
	}
}
