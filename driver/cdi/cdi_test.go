package cdi

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

func TestSpec(t *testing.T) {
	w := newWriter(t)
	tests := []struct {
		name    string
		claim   Claim
		wantEnv map[string][]string // CDI device name -> env
	}{
		{
			name: "one device, default time slicing",
			claim: Claim{UID: "uid-1", Namespace: "ns", Name: "c1", Devices: []Device{
				{Request: "gpu", Pool: "node-a", Name: "gpu-3", Index: 3, Sharing: Sharing{Strategy: "TimeSlicing", TimeSliceInterval: "Default"}},
			}},
			wantEnv: map[string][]string{"uid-1-gpu-3": {
				"GPU_DEVICE_3=gpu-3", "GPU_DEVICE_3_RESOURCE_CLAIM=uid-1",
				"GPU_DEVICE_3_SHARING_STRATEGY=TimeSlicing", "GPU_DEVICE_3_TIMESLICE_INTERVAL=Default",
			}},
		},
		{
			name: "two devices, space partitioning",
			claim: Claim{UID: "uid-2", Namespace: "ns", Name: "c2", Devices: []Device{
				{Request: "a", Pool: "node-a", Name: "gpu-0", Index: 0, Sharing: Sharing{Strategy: "SpacePartitioning", PartitionCount: 4}},
				{Request: "b/sub", Pool: "node-a", Name: "gpu-7", Index: 7, Sharing: Sharing{Strategy: "TimeSlicing", TimeSliceInterval: "Long"}, AdminAccess: true},
			}},
			wantEnv: map[string][]string{
				"uid-2-gpu-0": {"GPU_DEVICE_0=gpu-0", "GPU_DEVICE_0_RESOURCE_CLAIM=uid-2", "GPU_DEVICE_0_SHARING_STRATEGY=SpacePartitioning", "GPU_DEVICE_0_PARTITION_COUNT=4"},
				"uid-2-gpu-7": {"GPU_DEVICE_7=gpu-7", "GPU_DEVICE_7_RESOURCE_CLAIM=uid-2", "GPU_DEVICE_7_SHARING_STRATEGY=TimeSlicing", "GPU_DEVICE_7_TIMESLICE_INTERVAL=Long"},
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
				id := w.DeviceID(tc.claim.UID, d.Name)
				if want := "k8s.gpu.example.com/gpu=" + string(tc.claim.UID) + "-" + d.Name; id != want {
					t.Errorf("DeviceID = %q, want %q", id, want)
				}
				if spec.GetDevice(string(tc.claim.UID)+"-"+d.Name) == nil {
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
	c := Claim{UID: "u", Namespace: "ns", Name: "c", Devices: []Device{{Request: "r", Pool: "p", Name: "gpu-0", Sharing: Sharing{Strategy: "TimeSlicing"}}}}
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
	raw, _ := json.Marshal(map[string]any{"cdiVersion": "0.5.0", "kind": "k8s.gpu.example.com/gpu", "devices": []any{
		map[string]any{"name": "x", "containerEdits": map[string]any{"env": []string{"A=1"}}},
	}})
	if err := os.WriteFile(w.SpecPath("z"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Read("z"); err == nil {
		t.Error("Read accepted a spec without claim annotations")
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
