package resourceversion

import (
	"os"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

type upgradeCase struct {
	Name  string `json:"name"`
	Input string `json:"input"`
	// Want is the v1 object the API server returns for Input (defaults applied).
	Want  string `json:"want"`
	Error string `json:"error"`
}

// upgradeCases are testdata/cases.yaml.
func upgradeCases(tb testing.TB) []upgradeCase {
	tb.Helper()
	data, err := os.ReadFile("testdata/cases.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	var cases []upgradeCase
	if err := yaml.UnmarshalStrict(data, &cases); err != nil {
		tb.Fatal(err)
	}
	return cases
}

func TestDecode(t *testing.T) {
	for _, tc := range upgradeCases(t) {
		t.Run(tc.Name, func(t *testing.T) {
			obj, err := Decode([]byte(tc.Input), schema.GroupVersionKind{})
			if tc.Error != "" {
				if err == nil || !strings.Contains(err.Error(), tc.Error) {
					t.Fatalf("error %v, want %q", err, tc.Error)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want, err := Decode([]byte(tc.Want), schema.GroupVersionKind{})
			if err != nil {
				t.Fatalf("want: %v", err)
			}
			if want.Arrived.Version != "v1" {
				t.Fatalf("want must be v1, is %s", want.Arrived.Version)
			}
			got, _ := yaml.Marshal(obj.Spec())
			exp, _ := yaml.Marshal(want.Spec())
			if string(got) != string(exp) {
				t.Errorf("converted spec\n got:\n%s\nwant:\n%s", got, exp)
			}
			if obj.Deprecated() != (obj.Arrived.Version != "v1") {
				t.Errorf("Deprecated() = %t for %s", obj.Deprecated(), obj.Arrived)
			}
		})
	}
}

func TestDefault(t *testing.T) {
	spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
		{Name: "a", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "c"}},
		{Name: "b", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "c", AllocationMode: resourceapi.DeviceAllocationModeAll}},
		{Name: "c", FirstAvailable: []resourceapi.DeviceSubRequest{{Name: "x", DeviceClassName: "c", Count: 3}}},
	}}}
	Default(spec)
	r := spec.Devices.Requests
	if r[0].Exactly.AllocationMode != resourceapi.DeviceAllocationModeExactCount || r[0].Exactly.Count != 1 {
		t.Errorf("request a: %+v", r[0].Exactly)
	}
	if r[1].Exactly.Count != 0 {
		t.Errorf("request b (All) got a count: %+v", r[1].Exactly)
	}
	if s := r[2].FirstAvailable[0]; s.AllocationMode != resourceapi.DeviceAllocationModeExactCount || s.Count != 3 {
		t.Errorf("subrequest: %+v", s)
	}
}
