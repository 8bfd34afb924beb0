package plugin

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpu-dra/gpu-dra/driver/cdi"
	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// The checkpoint-v1 test data (../checkpoint/testdata/checkpoint-v1.json, testdata/checkpoint-v1/)
// was written by the plugin before the checkpoint had its own type: a node's state at the moment it
// is upgraded. The generator is in the history of this file (TestWriteCheckpointV1).

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

// upgradedNode is a plugin started on the state the v1 plugin left: its checkpoint and CDI specs.
// A nil checkpoint leaves a corrupt one instead.
func upgradedNode(t *testing.T, checkpointFile []byte) *harness {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	cdiDir, dataDir := t.TempDir(), t.TempDir()
	if checkpointFile == nil {
		checkpointFile = []byte("{broken")
	}
	if err := os.WriteFile(filepath.Join(dataDir, checkpoint.FileName), checkpointFile, 0o600); err != nil {
		t.Fatal(err)
	}
	specs, err := filepath.Glob(filepath.Join("testdata", "checkpoint-v1", "cdi", "*.json"))
	if err != nil || len(specs) != len(v1Claims()) {
		t.Fatalf("v1 specs %v, %v", specs, err)
	}
	for _, s := range specs {
		copyFile(t, s, filepath.Join(cdiDir, filepath.Base(s)))
	}
	w, err := cdi.NewWriter(cdiDir, testDriver)
	if err != nil {
		t.Fatal(err)
	}
	store := checkpoint.NewStore(dataDir, checkpoint.WithBootID(v1Boot))
	d, err := NewDriver(ctx, testDriver, testNode, simulated.New(testNode, nodegroups.GroupSpec{}), w, store)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{driver: d, cdi: w, store: store, dir: dataDir}
}

func readV1Checkpoint(t *testing.T) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "checkpoint", "testdata", "checkpoint-v1.json"))
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// After an upgrade, the plugin answers the kubelet's repeated prepares exactly as the v1 plugin
// did, leaves the v1 specs alone, writes the same container environment when a spec must be
// restored, and replaces the v1 file with the current format on its next save.
func TestCheckpointV1Upgrade(t *testing.T) {
	h := upgradedNode(t, readV1Checkpoint(t))
	_, ctx := ktesting.NewTestContext(t)
	res, err := h.driver.Reconcile(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Prepared != 3 || res.Corrupt != nil || len(res.RestoredSpecs)+len(res.RemovedOrphans)+len(res.Rebooted) != 0 {
		t.Fatalf("reconcile of an upgraded node changed something: %+v", res)
	}

	wantResults, err := os.ReadFile(filepath.Join("testdata", "checkpoint-v1", "prepare-results.json"))
	if err != nil {
		t.Fatal(err)
	}
	checkResults := func(when string) {
		t.Helper()
		got, err := h.driver.PrepareResourceClaims(ctx, v1Claims())
		if err != nil {
			t.Fatal(err)
		}
		// Metadata is for the helper's device metadata file, not part of the kubelet's answer;
		// it is what the device publishes.
		for uid, r := range got {
			for i, d := range r.Devices {
				if want := deviceMetadata(simulatedAttributes(t, d.DeviceName)); !reflect.DeepEqual(d.Metadata, want) {
					t.Errorf("%s: claim %s device %s: metadata %+v, want %+v", when, uid, d.DeviceName, d.Metadata, want)
				}
				r.Devices[i].Metadata = nil
			}
		}
		raw, err := json.MarshalIndent(got, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(append(raw, '\n'), wantResults) {
			t.Errorf("%s: prepare results differ from the v1 plugin's\ngot  %s\nwant %s", when, raw, wantResults)
		}
	}
	checkResults("v1 checkpoint")
	for _, c := range v1Claims() {
		v1Spec, _ := os.ReadFile(filepath.Join("testdata", "checkpoint-v1", "cdi", filepath.Base(h.cdi.SpecPath(c.UID))))
		if spec, _ := os.ReadFile(h.cdi.SpecPath(c.UID)); !bytes.Equal(spec, v1Spec) {
			t.Errorf("spec of %s rewritten although it was there", c.Name)
		}
		// Lost behind the plugin's back: prepare restores it from the entry.
		if err := os.Remove(h.cdi.SpecPath(c.UID)); err != nil {
			t.Fatal(err)
		}
	}
	checkResults("specs restored")
	for _, c := range v1Claims() {
		path := h.cdi.SpecPath(c.UID)
		restored, err := cdiapi.ReadSpec(path, 0)
		if err != nil {
			t.Fatal(err)
		}
		v1, err := cdiapi.ReadSpec(filepath.Join("testdata", "checkpoint-v1", "cdi", filepath.Base(path)), 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := restored.Annotations["prepared-claim"]; !ok {
			t.Errorf("restored spec of %s lacks its checkpoint entry", c.Name)
		}
		// Apart from the entry and DRA_ADMIN_ACCESS (added since, and ignored by a rolled-back
		// plugin), the same spec: what the container sees, and what a rolled-back plugin rebuilds
		// its state from.
		delete(restored.Annotations, "prepared-claim")
		admin := "DRA_ADMIN_ACCESS=false"
		for _, d := range v1.Devices {
			if d.Annotations["admin-access"] == "true" {
				admin = "DRA_ADMIN_ACCESS=true"
			}
		}
		for i := range v1.Devices {
			v1.Devices[i].ContainerEdits.Env = append(v1.Devices[i].ContainerEdits.Env, admin)
		}
		if !reflect.DeepEqual(restored.Spec, v1.Spec) {
			t.Errorf("restored spec of %s differs from the v1 plugin's\ngot  %+v\nwant %+v", c.Name, restored.Spec, v1.Spec)
		}
	}

	before, err := h.driver.PreparedClaims(ctx)
	if err != nil {
		t.Fatal(err)
	}
	prepare(t, h, claim("6f1c1c0e-0000-4000-8000-000000000004", "new", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-3")}))
	raw, err := os.ReadFile(h.store.Path())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(raw, []byte(`{"version":"gpu.example.com/checkpoint/v2"`)) {
		t.Errorf("checkpoint after a save is not in the current format: %.60s", raw)
	}
	after, err := h.driver.PreparedClaims(ctx)
	if err != nil {
		t.Fatal(err)
	}
	delete(after, "6f1c1c0e-0000-4000-8000-000000000004")
	if !reflect.DeepEqual(after, before) {
		t.Errorf("entries changed by rewriting the file\ngot  %+v\nwant %+v", after, before)
	}
	checkResults("v2 checkpoint")
}

// A checkpoint lost right after the upgrade: the v1 specs carry no entry, and the state rebuilt
// from them means what the v1 checkpoint meant.
func TestCheckpointV1RecoverFromSpecs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	want := upgradedNode(t, readV1Checkpoint(t))
	wantClaims, err := want.driver.PreparedClaims(ctx)
	if err != nil {
		t.Fatal(err)
	}

	h := upgradedNode(t, nil)
	res, err := h.driver.Reconcile(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Corrupt == nil || len(res.Recovered) != 3 {
		t.Fatalf("reconcile = %+v, want 3 claims recovered from a corrupt checkpoint", res)
	}
	got, err := h.driver.PreparedClaims(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, wantClaims) {
		t.Errorf("recovered from the v1 specs\n%+v\nfrom the v1 checkpoint\n%+v", got, wantClaims)
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
