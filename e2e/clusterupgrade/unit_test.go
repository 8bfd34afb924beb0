package clusterupgrade

import (
	"strings"
	"testing"
)

// TestStaleVersions: what the scenario counts as not yet migrated.
func TestStaleVersions(t *testing.T) {
	stored := map[string]string{
		"/registry/deviceclasses/gpu.example.com":         "resource.k8s.io/v1beta2",
		"/registry/resourceclaims/ns/a":                   "resource.k8s.io/v1",
		"/registry/resourceclaimtemplates/ns/example":     "resource.k8s.io/v1beta1",
		"/registry/devicetaintrules/rule":                 "resource.k8s.io/v1beta2",
		"/registry/resourceslices/node-gpu.example.com-x": "resource.k8s.io/v1",
	}
	got := staleVersions(stored)
	want := "/registry/deviceclasses/gpu.example.com (resource.k8s.io/v1beta2), /registry/resourceclaimtemplates/ns/example (resource.k8s.io/v1beta1)"
	if strings.Join(got, ", ") != want {
		t.Errorf("staleVersions = %q, want %q", got, want)
	}
}

// TestCheckVerdict: what the scenario takes for preflight's "safe" and "not safe".
func TestCheckVerdict(t *testing.T) {
	for _, tc := range []struct {
		out  string
		code int
		safe bool
		ok   bool
	}{
		{"Upgrade to Kubernetes 1.38: SAFE\n\nStored objects  SAFE\n", 0, true, true},
		{"Upgrade to Kubernetes 1.38: NOT SAFE\n\nStored objects  NOT SAFE\n", 2, false, true},
		{"Upgrade to Kubernetes 1.38: NOT SAFE\n", 2, true, false},
		{"Upgrade to Kubernetes 1.38: SAFE\n", 0, false, false},
		{"Upgrade to Kubernetes 1.38: UNKNOWN\n", 3, false, false},
		{"Upgrade to Kubernetes 1.38: SAFE\n", 2, true, false},
		{"Upgrade to Kubernetes 1.38: SAFE\n\nClients  NOT SAFE\n", 0, true, true},
	} {
		if err := checkVerdict(tc.out, tc.code, tc.safe); (err == nil) != tc.ok {
			t.Errorf("checkVerdict(%q, exit %d, safe %v) = %v, want ok %v", tc.out, tc.code, tc.safe, err, tc.ok)
		}
	}
}
