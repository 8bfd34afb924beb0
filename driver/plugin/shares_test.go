package plugin

import (
	"os"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/driver/cdi"
	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// sharedSpec is a node group of shared-memory GPUs with the default policies (80Gi, compute 100).
var sharedSpec = nodegroups.GroupSpec{Sharing: &nodegroups.Sharing{Mode: nodegroups.SharedMemory}}

func newSharedHarness(t testing.TB) *harness {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	h := newHarness(t)
	if err := h.driver.SetDevices(ctx, simulated.New(testNode, sharedSpec)); err != nil {
		t.Fatal(err)
	}
	return h
}

// shareResult is what the scheduler writes for a share of a shared-memory GPU.
func shareResult(request, device, shareID, memory, compute string) resourceapi.DeviceRequestAllocationResult {
	r := result(request, device)
	r.ShareID = ptr.To(types.UID(shareID))
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
		"memory": resource.MustParse(memory), "compute": resource.MustParse(compute),
	}
	return r
}

func TestPrepareShares(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	h := newSharedHarness(t)
	a := claim("uid-a", "a", []resourceapi.DeviceRequestAllocationResult{shareResult("gpu", "gpu-0", "share-a", "16Gi", "20")})
	b := claim("uid-b", "b", []resourceapi.DeviceRequestAllocationResult{shareResult("gpu", "gpu-0", "share-b", "16Gi", "20")})
	res, err := h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{a, b})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*resourceapi.ResourceClaim{a, b} {
		r := res[c.UID]
		if r.Err != nil || len(r.Devices) != 1 {
			t.Fatalf("claim %s: %+v", c.Name, r)
		}
		share := string(*c.Status.Allocation.Devices.Results[0].ShareID)
		dev := r.Devices[0]
		wantCDI := h.cdi.DeviceID(string(c.UID) + "-gpu-0-" + share)
		if dev.ShareID == nil || string(*dev.ShareID) != share || dev.DeviceName != "gpu-0" || len(dev.CDIDeviceIDs) != 1 || dev.CDIDeviceIDs[0] != wantCDI {
			t.Errorf("claim %s: device %+v, want share %s with CDI ID %s", c.Name, dev, share, wantCDI)
		}
		spec, err := h.cdi.Spec(mustEntry(t, h, c.UID))
		if err != nil {
			t.Fatal(err)
		}
		env := strings.Join(spec.Devices[0].ContainerEdits.Env, "\n")
		for _, want := range []string{"GPU_DEVICE_0=gpu-0", "GPU_DEVICE_0_MEMORY=16Gi", "GPU_DEVICE_0_COMPUTE=20"} {
			if !strings.Contains(env+"\n", want+"\n") {
				t.Errorf("claim %s: env lacks %s:\n%s", c.Name, want, env)
			}
		}
	}

	// The same claim again answers the same.
	again, err := h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{a})
	if err != nil || !apiequality.Semantic.DeepEqual(again[a.UID], res[a.UID]) {
		t.Errorf("second prepare = %+v, %v; want %+v", again[a.UID], err, res[a.UID])
	}

	// 16Gi + 16Gi + 50Gi is more than the GPU's 80Gi; compute would fit.
	big := claim("uid-c", "c", []resourceapi.DeviceRequestAllocationResult{shareResult("gpu", "gpu-0", "share-c", "50Gi", "20")})
	res, _ = h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{big})
	wantErr := "claim ns/c: device node-a/gpu-0: a share of memory 50Gi does not fit in its 80Gi beside the shares prepared ("
	if err := res[big.UID].Err; err == nil || !strings.HasPrefix(err.Error(), wantErr) || !strings.Contains(err.Error(), "ns/a 16Gi") || !strings.Contains(err.Error(), "ns/b 16Gi") {
		t.Errorf("over-committing share: %v\nwant %s... naming ns/a 16Gi and ns/b 16Gi", err, wantErr)
	}
	// A whole-device claim of a device with shares is refused as a second claim always was.
	whole := claim("uid-w", "w", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0")})
	res, _ = h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{whole})
	if err := res[whole.UID].Err; err == nil || !strings.Contains(err.Error(), "device node-a/gpu-0 is already prepared for claim ns/") {
		t.Errorf("whole device with shares held: %v", err)
	}
	// Two shares of one device within one claim count together.
	twice := claim("uid-t", "t", []resourceapi.DeviceRequestAllocationResult{
		shareResult("x", "gpu-1", "share-t1", "40Gi", "60"), shareResult("y", "gpu-1", "share-t2", "40Gi", "60")})
	res, _ = h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{twice})
	if err := res[twice.UID].Err; err == nil || !strings.Contains(err.Error(), "a share of compute 60 does not fit in its 100 beside the shares prepared (ns/t 60)") {
		t.Errorf("two shares of one claim over the device: %v", err)
	}

	// Unprepare releases that claim's share only; then the big one fits (16Gi + 50Gi).
	if _, err := h.driver.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: a.UID}}); err != nil {
		t.Fatal(err)
	}
	if !h.cdi.Exists(b.UID) || h.cdi.Exists(a.UID) {
		t.Errorf("after unprepare of a: spec of a %v, of b %v", h.cdi.Exists(a.UID), h.cdi.Exists(b.UID))
	}
	res, _ = h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{big})
	if err := res[big.UID].Err; err != nil {
		t.Errorf("50Gi beside 16Gi after a's unprepare: %v", err)
	}
}

// TestSharesRecoverFromSpecs: a lost checkpoint is rebuilt from the CDI specs with every share's
// ID and consumed capacity, so the guard still counts them.
func TestSharesRecoverFromSpecs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	h := newSharedHarness(t)
	a := claim("uid-a", "a", []resourceapi.DeviceRequestAllocationResult{shareResult("gpu", "gpu-0", "share-a", "40Gi", "50")})
	b := claim("uid-b", "b", []resourceapi.DeviceRequestAllocationResult{shareResult("gpu", "gpu-0", "share-b", "40Gi", "50")})
	r, after := rebuildFromSpecs(t, h, sharedSpec, a, b)
	if d := after[a.UID].Devices[0]; d.ShareID != "share-a" || !d.ConsumedCapacity["memory"].Equal(resource.MustParse("40Gi")) {
		t.Errorf("rebuilt share of a: %+v", d)
	}
	// The GPU is full: the guard must still know.
	c := claim("uid-c", "c", []resourceapi.DeviceRequestAllocationResult{shareResult("gpu", "gpu-0", "share-c", "1Gi", "1")})
	res, _ := r.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if res[c.UID].Err == nil {
		t.Error("a share beyond a full GPU was prepared after the rebuild")
	}
}

// TestExclusiveCDIUnchanged: an exclusive device's CDI device keeps its name and variables.
func TestExclusiveCDIUnchanged(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	h := newHarness(t)
	c := claim("uid-e", "e", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-2")})
	res, err := h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if err != nil || res[c.UID].Err != nil {
		t.Fatal(err, res[c.UID].Err)
	}
	if d := res[c.UID].Devices[0]; d.ShareID != nil || d.CDIDeviceIDs[0] != h.cdi.DeviceID(cdi.DeviceName(c.UID, "gpu-2")) {
		t.Errorf("exclusive device %+v", d)
	}
	spec, err := h.cdi.Spec(mustEntry(t, h, c.UID))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"GPU_DEVICE_2=gpu-2", "GPU_DEVICE_2_RESOURCE_CLAIM=uid-e", "GPU_DEVICE_2_SHARING_STRATEGY=TimeSlicing",
		"GPU_DEVICE_2_TIMESLICE_INTERVAL=Default", "DRA_ADMIN_ACCESS=false"}
	if got := spec.Devices[0].ContainerEdits.Env; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("env %v, want %v", got, want)
	}
	if _, ok := spec.Devices[0].Annotations["share-id"]; ok {
		t.Error("exclusive device annotated with a share ID")
	}
}

// rebuildFromSpecs prepares claims, loses the checkpoint, and restarts the driver with the
// devices of spec; the rebuilt entries must be those prepared. It returns the restarted harness
// and the entries.
func rebuildFromSpecs(t *testing.T, h *harness, spec nodegroups.GroupSpec, claims ...*resourceapi.ResourceClaim) (*harness, map[types.UID]checkpoint.PreparedClaim) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	if _, err := h.driver.PrepareResourceClaims(ctx, claims); err != nil {
		t.Fatal(err)
	}
	before, err := h.driver.PreparedClaims(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(h.store.Path(), []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := h.restart(t)
	if err := r.driver.SetDevices(ctx, simulated.New(testNode, spec)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.driver.Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	after, err := r.driver.PreparedClaims(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !apiequality.Semantic.DeepEqual(after, before) {
		t.Errorf("rebuilt %+v\nwant %+v", after, before)
	}
	return r, after
}

func mustEntry(t *testing.T, h *harness, uid types.UID) checkpoint.PreparedClaim {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	claims, err := h.driver.PreparedClaims(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, ok := claims[uid]
	if !ok {
		t.Fatalf("claim %s not prepared", uid)
	}
	return c
}
