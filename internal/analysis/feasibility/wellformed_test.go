package feasibility

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

func TestWellFormed(t *testing.T) {
	exactly := &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.example.com"}
	sub := func(name string) resourceapi.DeviceSubRequest {
		return resourceapi.DeviceSubRequest{Name: name, DeviceClassName: "gpu.example.com"}
	}
	for _, tc := range []struct {
		name     string
		requests []resourceapi.DeviceRequest
		cons     []resourceapi.DeviceConstraint
		want     string // substring of the error; "" for none
	}{
		{name: "valid", requests: []resourceapi.DeviceRequest{{Name: "a", Exactly: exactly}, {Name: "b", FirstAvailable: []resourceapi.DeviceSubRequest{sub("x"), sub("y")}}},
			cons: []resourceapi.DeviceConstraint{{Requests: []string{"a", "b/x"}}}},
		{name: "duplicate request", requests: []resourceapi.DeviceRequest{{Name: "a", FirstAvailable: []resourceapi.DeviceSubRequest{sub("x")}}, {Name: "a", Exactly: exactly}},
			want: `requests[1].name: duplicate name "a"`},
		{name: "neither", requests: []resourceapi.DeviceRequest{{Name: "a"}}, want: "requests[0]: exactly one of"},
		{name: "both", requests: []resourceapi.DeviceRequest{{Name: "a", Exactly: exactly, FirstAvailable: []resourceapi.DeviceSubRequest{sub("x")}}}, want: "requests[0]: exactly one of"},
		{name: "duplicate subrequest", requests: []resourceapi.DeviceRequest{{Name: "a", FirstAvailable: []resourceapi.DeviceSubRequest{sub("x"), sub("x")}}},
			want: `firstAvailable[1].name: duplicate name "x"`},
		{name: "empty request name", requests: []resourceapi.DeviceRequest{{FirstAvailable: []resourceapi.DeviceSubRequest{sub("x")}}},
			want: `requests[0].name: ""`},
		{name: "request name not a DNS label", requests: []resourceapi.DeviceRequest{{Name: "GPU_0", Exactly: exactly}},
			want: `requests[0].name: "GPU_0"`},
		{name: "empty subrequest name", requests: []resourceapi.DeviceRequest{{Name: "a", FirstAvailable: []resourceapi.DeviceSubRequest{sub("")}}},
			want: `firstAvailable[0].name: ""`},
		{name: "constraint names nothing", requests: []resourceapi.DeviceRequest{{Name: "a", Exactly: exactly}},
			cons: []resourceapi.DeviceConstraint{{Requests: []string{"a", "zz/x"}}}, want: `constraints[0].requests[1]: no request named "zz/x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := WellFormed(&resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: tc.requests, Constraints: tc.cons}})
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
