package devicestatus

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

func gpuAttributes(index int, model string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	return map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"index":         {IntValue: ptr.To(int64(index))},
		"uuid":          {StringValue: ptr.To(fmt.Sprintf("gpu-uuid-%d", index))},
		"model":         {StringValue: ptr.To(model)},
		"driverVersion": {VersionValue: ptr.To("1.0.0")},
	}
}

// jsonOverhead is what Data adds around the model string of gpuAttributes(3, model).
var jsonOverhead = len(`{"driverVersion":{"version":"1.0.0"},"index":{"int":3},"model":{"string":""},"uuid":{"string":"gpu-uuid-3"}}`)

func TestData(t *testing.T) {
	tests := []struct {
		name    string
		attrs   map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
		want    string
		wantErr string
	}{
		{
			name:  "a GPU: the reference driver's three attributes plus index, keys sorted",
			attrs: gpuAttributes(3, "LATEST-GPU-MODEL"),
			want:  `{"driverVersion":{"version":"1.0.0"},"index":{"int":3},"model":{"string":"LATEST-GPU-MODEL"},"uuid":{"string":"gpu-uuid-3"}}`,
		},
		{
			name: "other attributes are not repeated",
			attrs: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"uuid":                            {StringValue: ptr.To("u")},
				"resource.kubernetes.io/pciBusID": {StringValue: ptr.To("0000:01:00.0")},
				"memoryGiB":                       {IntValue: ptr.To(int64(80))},
			},
			want: `{"uuid":{"string":"u"}}`,
		},
		{name: "no attributes: no data", attrs: nil},
		{name: "none of ours: no data", attrs: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"x": {BoolValue: ptr.To(true)}}},
		{
			name:  "exactly the API server's limit",
			attrs: gpuAttributes(3, strings.Repeat("m", MaxDataBytes-jsonOverhead)),
			want:  `{"driverVersion":{"version":"1.0.0"},"index":{"int":3},"model":{"string":"` + strings.Repeat("m", MaxDataBytes-jsonOverhead) + `"},"uuid":{"string":"gpu-uuid-3"}}`,
		},
		{
			name:    "one byte over the limit",
			attrs:   gpuAttributes(3, strings.Repeat("m", MaxDataBytes-jsonOverhead+1)),
			wantErr: "status data of 10241 bytes exceeds the API server's limit of 10240",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Data(tc.attrs)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("Data error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("Data = %s\nwant   %s", got, tc.want)
			}
			if got == nil {
				return
			}
			// What a reader does: decode into the ResourceSlice's attribute type.
			var back map[string]resourceapi.DeviceAttribute
			if err := json.Unmarshal(got, &back); err != nil {
				t.Fatalf("data is not a JSON object of DeviceAttribute: %v", err)
			}
			for name, a := range back {
				if want := tc.attrs[resourceapi.QualifiedName(name)]; !reflect.DeepEqual(a, want) {
					t.Errorf("%s = %v, want %v", name, a, want)
				}
			}
		})
	}
}

func TestEntries(t *testing.T) {
	var many []Device
	for i := range 128 {
		many = append(many, Device{Pool: "node-a", Name: fmt.Sprintf("gpu-%d", i), Attributes: gpuAttributes(i, "M")})
	}
	got, err := entries(many)
	if err != nil || len(got) != 128 {
		t.Fatalf("128 devices: %d entries, %v", len(got), err)
	}
	for i, e := range got {
		if e.device != fmt.Sprintf("gpu-%d", i) || !strings.Contains(string(e.data), fmt.Sprintf(`"index":{"int":%d}`, i)) {
			t.Errorf("entry %d: %s %s", i, e.device, e.data)
		}
	}

	// A device whose data cannot be stored, and one without attributes, cost only their own entry.
	mixed := []Device{
		{Pool: "node-a", Name: "gpu-0", Attributes: gpuAttributes(0, "M")},
		{Pool: "node-a", Name: "gpu-1", Attributes: gpuAttributes(1, strings.Repeat("m", MaxDataBytes))},
		{Pool: "node-a", Name: "gpu-2"},
		{Pool: "node-a", Name: "gpu-3", Attributes: gpuAttributes(3, "M")},
	}
	got, err = entries(mixed)
	if err == nil || !strings.Contains(err.Error(), "device node-a/gpu-1: status data of") {
		t.Errorf("error %v does not name gpu-1 and its size", err)
	}
	if len(got) != 2 || got[0].device != "gpu-0" || got[1].device != "gpu-3" {
		t.Errorf("entries = %+v, want gpu-0 and gpu-3", got)
	}
}

func TestRecorded(t *testing.T) {
	data := `{"index":{"int":0},"uuid":{"string":"u0"}}`
	want := []entry{{pool: "p", device: "gpu-0", data: []byte(data)}}
	status := func(driver, device, raw string, shareID *string) resourceapi.AllocatedDeviceStatus {
		s := resourceapi.AllocatedDeviceStatus{Driver: driver, Pool: "p", Device: device, ShareID: shareID}
		if raw != "" {
			s.Data = &runtime.RawExtension{Raw: []byte(raw)}
		}
		return s
	}
	tests := []struct {
		name     string
		observed []resourceapi.AllocatedDeviceStatus
		want     bool
	}{
		{"nothing yet", nil, false},
		{"same bytes", []resourceapi.AllocatedDeviceStatus{status("d", "gpu-0", data, nil)}, true},
		{"same object, re-encoded", []resourceapi.AllocatedDeviceStatus{status("d", "gpu-0", "{ \"uuid\": {\"string\":\"u0\"}, \"index\": {\"int\": 0} }", nil)}, true},
		{"other data", []resourceapi.AllocatedDeviceStatus{status("d", "gpu-0", `{"uuid":{"string":"u1"}}`, nil)}, false},
		{"entry without data (another writer's conditions)", []resourceapi.AllocatedDeviceStatus{status("d", "gpu-0", "", nil)}, false},
		{"data not JSON", []resourceapi.AllocatedDeviceStatus{status("d", "gpu-0", "{", nil)}, false},
		{"another driver's device of the same name", []resourceapi.AllocatedDeviceStatus{status("other", "gpu-0", data, nil)}, false},
		{"a share of the device", []resourceapi.AllocatedDeviceStatus{status("d", "gpu-0", data, ptr.To("share"))}, false},
		{"among others", []resourceapi.AllocatedDeviceStatus{status("other", "x", "", nil), status("d", "gpu-1", data, nil), status("d", "gpu-0", data, nil)}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := recorded("d", tc.observed, want); got != tc.want {
				t.Errorf("recorded = %v, want %v", got, tc.want)
			}
		})
	}
	if !recorded("d", nil, nil) {
		t.Error("no entries wanted must count as recorded")
	}
	// A share is keyed by its share ID too: another share of the same device does not count.
	wantShare := []entry{{pool: "p", device: "gpu-0", shareID: "s1", data: []byte(data)}}
	if recorded("d", []resourceapi.AllocatedDeviceStatus{status("d", "gpu-0", data, nil), status("d", "gpu-0", data, ptr.To("s2"))}, wantShare) {
		t.Error("share s1 counted as recorded from the whole device's and share s2's entries")
	}
	if !recorded("d", []resourceapi.AllocatedDeviceStatus{status("d", "gpu-0", data, ptr.To("s2")), status("d", "gpu-0", data, ptr.To("s1"))}, wantShare) {
		t.Error("share s1 not found among the shares")
	}
}
