package plugin

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra/driver/devicestatus"
	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

func TestRemoveStaleMetadata(t *testing.T) {
	h := newHarness(t)
	_, ctx := ktesting.NewTestContext(t)
	kept := claim("6f1c1c0e-0000-4000-8000-000000000001", "kept", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0")})
	prepare(t, h, kept)

	loc := MetadataLocation{DataDir: h.dir, CDIDir: t.TempDir()}
	files := []string{
		// The prepared claim's, as the library writes them: kept.
		"data/dra-device-metadata/ns_kept/gpu/metadata.json",
		"cdi/gpu.example.com_metadata_6f1c1c0e-0000-4000-8000-000000000001_gpu.json",
		"cdi/gpu.example.com_metadata_6f1c1c0e-0000-4000-8000-000000000001_other.json",
		// Of claims not prepared (any more): removed.
		"data/dra-device-metadata/ns_gone/gpu/metadata.json",
		"data/dra-device-metadata/other_kept/gpu/metadata.json",
		"cdi/gpu.example.com_metadata_6f1c1c0e-0000-4000-8000-0000000000ff_gpu.json",
		// Not the library's metadata of this driver: kept.
		"cdi/nic.example.com_metadata_6f1c1c0e-0000-4000-8000-0000000000ff_gpu.json",
		"cdi/k8s.gpu.example.com-gpu_6f1c1c0e-0000-4000-8000-0000000000ff.json",
		"cdi/gpu.example.com_metadata_.json",
		"cdi/gpu.example.com_metadata_x.yaml",
	}
	path := func(f string) string {
		if rest, ok := strings.CutPrefix(f, "data/"); ok {
			return filepath.Join(loc.DataDir, rest)
		}
		rest, _ := strings.CutPrefix(f, "cdi/")
		return filepath.Join(loc.CDIDir, rest)
	}
	for _, f := range files {
		if err := os.MkdirAll(filepath.Dir(path(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path(f), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stale, err := h.driver.RemoveStaleMetadata(ctx, loc)
	if err != nil {
		t.Fatal(err)
	}
	want := &StaleMetadata{
		Dirs:  []string{"ns_gone", "other_kept"},
		Specs: []string{"gpu.example.com_metadata_6f1c1c0e-0000-4000-8000-0000000000ff_gpu.json"},
	}
	if !reflect.DeepEqual(stale, want) {
		t.Errorf("removed %+v, want %+v", stale, want)
	}
	for i, f := range files {
		_, err := os.Stat(path(f))
		if removed := i >= 3 && i <= 5; removed != os.IsNotExist(err) {
			t.Errorf("%s: removed %v, want %v", f, os.IsNotExist(err), removed)
		}
	}

	// Nothing written yet (metadata never enabled): nothing to do, no error.
	if stale, err := h.driver.RemoveStaleMetadata(ctx, MetadataLocation{DataDir: t.TempDir(), CDIDir: filepath.Join(t.TempDir(), "missing")}); err != nil || len(stale.Dirs)+len(stale.Specs) != 0 {
		t.Errorf("empty directories: %+v, %v", stale, err)
	}
}

// statusCalls records what the driver asks of its StatusRecorder.
type statusCalls struct {
	mutex    sync.Mutex
	recorded map[types.UID][]devicestatus.Device
	resynced []types.UID
	forgot   []types.UID
}

func (s *statusCalls) Record(c *resourceapi.ResourceClaim, devices []devicestatus.Device) {
	s.mutex.Lock()
	defer s.mutex.Unlock()
	s.recorded[c.UID] = devices
}

func (s *statusCalls) Resync(_, _ string, uid types.UID, _ []devicestatus.Device) {
	s.mutex.Lock()
	defer s.mutex.Unlock()
	s.resynced = append(s.resynced, uid)
}

func (s *statusCalls) Forget(uid types.UID) {
	s.mutex.Lock()
	defer s.mutex.Unlock()
	s.forgot = append(s.forgot, uid)
}

// Prepare hands each prepared claim with its devices' published attributes to the status
// recorder and their metadata to the helper; failed prepares hand over nothing.
func TestPrepareRecordsStatusAndMetadata(t *testing.T) {
	h := newHarness(t)
	calls := &statusCalls{recorded: map[types.UID][]devicestatus.Device{}}
	WithStatusRecorder(calls)(h.driver)
	_, ctx := ktesting.NewTestContext(t)
	ok := claim("u1", "ok", []resourceapi.DeviceRequestAllocationResult{result("a", "gpu-0"), result("b", "gpu-5")})
	notHere := claim("u2", "not-here", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-99")})
	res, err := h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{ok, notHere})
	if err != nil || res["u1"].Err != nil || res["u2"].Err == nil {
		t.Fatalf("prepare = %+v, %v", res, err)
	}
	attrs := simulatedAttributes(t, "gpu-5")
	want := []devicestatus.Device{
		{Pool: testNode, Name: "gpu-0", Attributes: simulatedAttributes(t, "gpu-0")},
		{Pool: testNode, Name: "gpu-5", Attributes: attrs},
	}
	if !reflect.DeepEqual(calls.recorded, map[types.UID][]devicestatus.Device{"u1": want}) {
		t.Errorf("recorded %+v, want u1 with %+v", calls.recorded, want)
	}
	if got := res["u1"].Devices[1].Metadata; got == nil || !reflect.DeepEqual(got, &kubeletplugin.DeviceMetadata{Attributes: map[string]resourceapi.DeviceAttribute{
		"index": attrs["index"], "uuid": attrs["uuid"], "model": attrs["model"], "driverVersion": attrs["driverVersion"],
	}}) {
		t.Errorf("metadata of gpu-5 = %+v", got)
	}

	// A restarted plugin queues every prepared claim; unprepare drops the claim's queued work.
	if err := h.driver.ResyncStatus(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := h.driver.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "u1"}, {UID: "u3"}}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(calls.resynced, []types.UID{"u1"}) || !slices.Equal(calls.forgot, []types.UID{"u1", "u3"}) {
		t.Errorf("resynced %v, forgot %v; want u1, and u1 u3", calls.resynced, calls.forgot)
	}
}

// simulatedAttributes are the attributes the node's simulated device publishes.
func simulatedAttributes(t *testing.T, name string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	t.Helper()
	devs, err := simulated.New(testNode, nodegroups.GroupSpec{}).Devices(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.Name == name {
			return d.Attributes
		}
	}
	t.Fatalf("no simulated device %s", name)
	return nil
}
