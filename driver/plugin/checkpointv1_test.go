package plugin

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/driver/cdi"
	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// v1Boot is the boot ID recorded in the checkpoint-v1 test data.
const v1Boot = "boot-checkpoint-v1"

// v1Claims are the claims the checkpoint-v1 test data was prepared from: every sharing setting a
// GpuConfig can ask for, a config for one request and its subrequest, and an admin-access device
// next to an exclusive one.
func v1Claims() []*resourceapi.ResourceClaim {
	admin := result("gpu", "gpu-1")
	admin.AdminAccess = ptr.To(true)
	return []*resourceapi.ResourceClaim{
		claim("6f1c1c0e-0000-4000-8000-000000000001", "default", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0")}),
		claim("6f1c1c0e-0000-4000-8000-000000000002", "mixed",
			[]resourceapi.DeviceRequestAllocationResult{result("a", "gpu-1"), result("b/small", "gpu-2")},
			opaque(resourceapi.AllocationConfigSourceClass, nil, testDriver, gpuConfig(`{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}`)),
			opaque(resourceapi.AllocationConfigSourceClaim, []string{"b"}, testDriver, gpuConfig(`{"strategy":"SpacePartitioning","spacePartitioningConfig":{"partitionCount":3}}`))),
		claim("6f1c1c0e-0000-4000-8000-000000000003", "monitor", []resourceapi.DeviceRequestAllocationResult{admin},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, testDriver, gpuConfig(`{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Short"}}`))),
	}
}

// TestWriteCheckpointV1 wrote the checkpoint-v1 test data with the plugin as it was before the
// checkpoint got its own type (commit of this file). Run with GPU_DRA_WRITE_CHECKPOINT_V1=1.
func TestWriteCheckpointV1(t *testing.T) {
	if os.Getenv("GPU_DRA_WRITE_CHECKPOINT_V1") == "" {
		t.Skip("writes test data; set GPU_DRA_WRITE_CHECKPOINT_V1=1")
	}
	_, ctx := ktesting.NewTestContext(t)
	cdiDir, dataDir := t.TempDir(), t.TempDir()
	w, err := cdi.NewWriter(cdiDir, testDriver)
	if err != nil {
		t.Fatal(err)
	}
	d, err := NewDriver(ctx, testDriver, testNode, simulated.New(testNode, nodegroups.GroupSpec{}), w,
		checkpoint.NewStore(dataDir, checkpoint.WithBootID(v1Boot)))
	if err != nil {
		t.Fatal(err)
	}
	res, err := d.PrepareResourceClaims(ctx, v1Claims())
	if err != nil {
		t.Fatal(err)
	}
	for uid, r := range res {
		if r.Err != nil {
			t.Fatalf("prepare %s: %v", uid, r.Err)
		}
	}
	results, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join("testdata", "checkpoint-v1")
	if err := os.MkdirAll(filepath.Join(out, "cdi"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "prepare-results.json"), append(results, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join(dataDir, checkpoint.FileName), filepath.Join("..", "checkpoint", "testdata", "checkpoint-v1.json"))
	specs, err := filepath.Glob(filepath.Join(cdiDir, "*.json"))
	if err != nil || len(specs) != len(v1Claims()) {
		t.Fatalf("specs %v, %v", specs, err)
	}
	for _, s := range specs {
		copyFile(t, s, filepath.Join(out, "cdi", filepath.Base(s)))
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	raw, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}
