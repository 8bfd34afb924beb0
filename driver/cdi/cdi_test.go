package cdi

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
)

func TestSpec(t *testing.T) {
	w := newWriter(t)
	tests := []struct {
		name    string
		claim   checkpoint.PreparedClaim
		wantEnv map[string][]string // CDI device name -> env
	}{
		{
			name: "one device, default time slicing",
			claim: checkpoint.PreparedClaim{UID: "uid-1", Namespace: "ns", Name: "c1", Devices: []checkpoint.PreparedDevice{
				{Request: "gpu", Pool: "node-a", Device: "gpu-3", Index: 3, Sharing: checkpoint.Sharing{Strategy: "TimeSlicing", TimeSliceInterval: "Default"}, CDIDevice: DeviceName("uid-1", "gpu-3")},
			}},
			wantEnv: map[string][]string{"uid-1-gpu-3": {
				"GPU_DEVICE_3=gpu-3", "GPU_DEVICE_3_RESOURCE_CLAIM=uid-1",
				"GPU_DEVICE_3_SHARING_STRATEGY=TimeSlicing", "GPU_DEVICE_3_TIMESLICE_INTERVAL=Default",
				"DRA_ADMIN_ACCESS=false",
			}},
		},
		{
			// Admin access for one request flags the whole claim, as in the reference driver.
			name: "two devices, space partitioning, admin access",
			claim: checkpoint.PreparedClaim{UID: "uid-2", Namespace: "ns", Name: "c2", Devices: []checkpoint.PreparedDevice{
				{Request: "a", Pool: "node-a", Device: "gpu-0", Index: 0, Sharing: checkpoint.Sharing{Strategy: "SpacePartitioning", PartitionCount: 4}, CDIDevice: DeviceName("uid-2", "gpu-0")},
				{Request: "b/sub", Pool: "node-a", Device: "gpu-7", Index: 7, Sharing: checkpoint.Sharing{Strategy: "TimeSlicing", TimeSliceInterval: "Long"}, AdminAccess: true, CDIDevice: DeviceName("uid-2", "gpu-7")},
			}},
			wantEnv: map[string][]string{
				"uid-2-gpu-0": {"GPU_DEVICE_0=gpu-0", "GPU_DEVICE_0_RESOURCE_CLAIM=uid-2", "GPU_DEVICE_0_SHARING_STRATEGY=SpacePartitioning", "GPU_DEVICE_0_PARTITION_COUNT=4", "DRA_ADMIN_ACCESS=true"},
				"uid-2-gpu-7": {"GPU_DEVICE_7=gpu-7", "GPU_DEVICE_7_RESOURCE_CLAIM=uid-2", "GPU_DEVICE_7_SHARING_STRATEGY=TimeSlicing", "GPU_DEVICE_7_TIMESLICE_INTERVAL=Long", "DRA_ADMIN_ACCESS=true"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := w.Write(tc.claim); err != nil {
				t.Fatal(err)
			}
			path := w.SpecPath(tc.claim.UID)
			if want := filepath.Join(w.root, "k8s.gpu.example.com-gpu_"+string(tc.claim.UID)+".json"); path != want {
				t.Errorf("spec path %s, want %s", path, want)
			}
			// Read it the way a container runtime does.
			spec, err := cdiapi.ReadSpec(path, 0)
			if err != nil {
				t.Fatalf("runtime cannot read spec: %v", err)
			}
			if spec.Kind != "k8s.gpu.example.com/gpu" {
				t.Errorf("kind %q", spec.Kind)
			}
			got := map[string][]string{}
			for _, d := range spec.Devices {
				got[d.Name] = d.ContainerEdits.Env
			}
			if !reflect.DeepEqual(got, tc.wantEnv) {
				t.Errorf("env = %v\nwant  %v", got, tc.wantEnv)
			}
			for _, d := range tc.claim.Devices {
				id := w.DeviceID(d.CDIDevice)
				if want := "k8s.gpu.example.com/gpu=" + string(tc.claim.UID) + "-" + d.Device; id != want {
					t.Errorf("DeviceID = %q, want %q", id, want)
				}
				if spec.GetDevice(string(tc.claim.UID)+"-"+d.Device) == nil {
					t.Errorf("spec lacks device for %s", id)
				}
			}
			back, err := w.Read(tc.claim.UID)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back, tc.claim) {
				t.Errorf("Read = %+v\nwant %+v", back, tc.claim)
			}
		})
	}
	uids, err := w.List()
	if err != nil {
		t.Fatal(err)
	}
	if want := []types.UID{"uid-1", "uid-2"}; !slices.Equal(uids, want) {
		t.Errorf("List = %v, want %v", uids, want)
	}
}

func TestRemoveIsIdempotent(t *testing.T) {
	w := newWriter(t)
	c := checkpoint.PreparedClaim{UID: "u", Namespace: "ns", Name: "c", Devices: []checkpoint.PreparedDevice{
		{Request: "r", Pool: "p", Device: "gpu-0", Sharing: checkpoint.Sharing{Strategy: "TimeSlicing"}, CDIDevice: "u-gpu-0"}}}
	if err := w.Write(c); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := w.Remove("u"); err != nil {
			t.Fatalf("Remove #%d: %v", i, err)
		}
	}
	if w.Exists("u") {
		t.Error("spec still exists")
	}
}

func TestListIgnoresOtherFiles(t *testing.T) {
	w := newWriter(t)
	for _, name := range []string{"nvidia.com-gpu.yaml", "k8s.other.example.com-gpu_x.json", "spec.123.tmp", "k8s.gpu.example.com-gpu_y.json.tmp"} {
		if err := os.WriteFile(filepath.Join(w.root, name), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	uids, err := w.List()
	if err != nil || len(uids) != 0 {
		t.Errorf("List = %v, %v; want nothing", uids, err)
	}
}

func TestReadRejectsForeignSpec(t *testing.T) {
	w := newWriter(t)
	entry, err := checkpoint.EncodeClaim(checkpoint.PreparedClaim{UID: "other", Namespace: "ns", Name: "c"})
	if err != nil {
		t.Fatal(err)
	}
	for name, annotations := range map[string]map[string]string{
		"no claim annotations":   nil,
		"entry of another claim": {"prepared-claim": entry},
		"entry not decodable":    {"prepared-claim": `{"version":"gpu.example.com/checkpoint/v0"}`},
	} {
		spec := map[string]any{"cdiVersion": "0.6.0", "kind": "k8s.gpu.example.com/gpu", "devices": []any{
			map[string]any{"name": "x", "containerEdits": map[string]any{"env": []string{"A=1"}}},
		}}
		if annotations != nil {
			spec["annotations"] = annotations
		}
		raw, _ := json.Marshal(spec)
		if err := os.WriteFile(w.SpecPath("z"), raw, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Read("z"); err == nil {
			t.Errorf("%s: Read accepted the spec", name)
		}
	}
}

// Recovery reads the entry a spec carries, not the environment rendered from it: changing the
// variables a container sees cannot change what a restarted plugin believes is prepared.
func TestReadIgnoresEnvironment(t *testing.T) {
	w := newWriter(t)
	c := checkpoint.PreparedClaim{UID: "u", Namespace: "ns", Name: "c", Devices: []checkpoint.PreparedDevice{
		{Request: "r", Pool: "p", Device: "gpu-2", Index: 2, Sharing: checkpoint.Sharing{Strategy: "SpacePartitioning", PartitionCount: 2}, CDIDevice: "u-gpu-2"}}}
	spec, err := w.Spec(c)
	if err != nil {
		t.Fatal(err)
	}
	for i := range spec.Devices {
		spec.Devices[i].ContainerEdits.Env = []string{"RENAMED_GPU=gpu-2"}
	}
	raw, _ := json.Marshal(spec)
	if err := os.WriteFile(w.SpecPath(c.UID), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	back, err := w.Read(c.UID)
	if err != nil || !reflect.DeepEqual(back, c) {
		t.Errorf("Read = %+v, %v; want %+v", back, err, c)
	}
}

// A spec without its checkpoint entry was not written by this plugin: Read refuses it rather than
// guess the claim from the container's environment.
func TestReadWithoutEntry(t *testing.T) {
	w := newWriter(t)
	raw := `{"cdiVersion":"0.6.0","kind":"k8s.gpu.example.com/gpu",
	  "annotations":{"claim-name":"c","claim-namespace":"ns","claim-uid":"u"},
	  "devices":[{"name":"u-gpu-1","containerEdits":{"env":["GPU_DEVICE_1=gpu-1"]}}]}`
	if err := os.WriteFile(w.SpecPath("u"), []byte(raw), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := w.Read("u"); err == nil || !strings.Contains(err.Error(), "no prepared-claim annotation") {
		t.Errorf("Read = %+v, %v; want it refused for lacking the prepared-claim annotation", got, err)
	}
}

func newWriter(t *testing.T) *Writer {
	t.Helper()
	w, err := NewWriter(t.TempDir(), "gpu.example.com")
	if err != nil {
		t.Fatal(err)
	}
	return w
}
