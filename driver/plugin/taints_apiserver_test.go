package plugin

import (
	"strings"
	"testing"

	draclient "k8s.io/dynamic-resource-allocation/client"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// TestProbeDeviceTaintsOnAPIServer asks a real kube-apiserver (1.33 or later: DRADeviceTaints
// exists) with the gate off, as 1.33-1.35 run by default, and on, as 1.36+ do; with the gate on
// also through v1beta1 only, where the DRA client converts the probe slice.
func TestProbeDeviceTaintsOnAPIServer(t *testing.T) {
	for _, tc := range []struct {
		name, gates, runtimeConfig string
		wantDropped                bool
	}{
		{name: "gate off", gates: "DRADeviceTaints=false", wantDropped: true},
		{name: "gate on", gates: "DRADeviceTaints=true"},
		{name: "gate on, v1beta1 only", gates: "DRADeviceTaints=true", runtimeConfig: testapiserver.V1Beta1Only},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []testapiserver.Option{testapiserver.WithFeatureGates(tc.gates)}
			if tc.runtimeConfig != "" {
				opts = append(opts, testapiserver.WithRuntimeConfig(tc.runtimeConfig))
			}
			srv := testapiserver.Start(t, opts...)
			reason, err := ProbeDeviceTaints(t.Context(), draclient.New(srv.Clientset).ResourceSlices(), testDriver, testNode)
			if err != nil {
				t.Fatal(err)
			}
			if dropped := reason != ""; dropped != tc.wantDropped {
				t.Errorf("reason %q, want dropped=%v", reason, tc.wantDropped)
			}
			if tc.wantDropped && !strings.Contains(reason, "DRADeviceTaints off") {
				t.Errorf("reason %q does not name the gate", reason)
			}
		})
	}
}
