package app

import (
	"strings"
	"testing"
)

// TestReadClusterStateCostlyQuantity: a cluster-state file whose quantities resource.ParseQuantity
// would parse for seconds is refused before they are decoded, each naming its field, whichever
// object holds it; the same text elsewhere (a label) is read.
func TestReadClusterStateCostlyQuantity(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"pod limit", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"memory":"1e-5000000"}}}]}}`,
			`spec.containers[0].resources.limits[memory]: "1e-5000000": exponent out of range`},
		{"node capacity", `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"},"status":{"capacity":{"cpu":"1e-5000000"}}}`,
			`status.capacity[cpu]: "1e-5000000": exponent out of range`},
		{"slice capacity", `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"s"},"spec":{"driver":"gpu.example.com","nodeName":"n","pool":{"name":"n","generation":1,"resourceSliceCount":1},
"devices":[{"name":"gpu-0","capacity":{"memory":{"value":"1e-5000000"}}}]}}`,
			`spec.devices[0].capacity[memory].value: "1e-5000000": exponent out of range`},
		{"claim request", `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"c"},"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu.example.com","capacity":{"requests":{"memory":"1e-5000000"}}}}]}}}`,
			`spec.devices.requests[0].exactly.capacity.requests[memory]: "1e-5000000": exponent out of range`},
		{"label", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"limits":"1e-5000000"}},"spec":{"containers":[{"name":"c","args":["1e-5000000"]}]}}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := readClusterState([]byte(tc.doc))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("readClusterState: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("readClusterState: %v; want %q", err, tc.want)
			}
		})
	}
}
