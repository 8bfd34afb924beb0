package feasibility

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility/feasibilitytest"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// TestOnlyTaintedDevices: a claim that only tainted devices could satisfy is told so, with the
// node and the taints; one that untainted devices satisfy, or one that tolerates the taints, is
// feasible; one that fails for other reasons keeps its explanation.
func TestOnlyTaintedDevices(t *testing.T) {
	unhealthy := resourceapi.DeviceTaint{Key: "gpu.example.com/unhealthy", Value: "xid", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	st := &inventory.Objects{Classes: feasibilitytest.Classes()}
	for _, node := range []string{"n0", "n1"} {
		st.Nodes = append(st.Nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
		s := feasibilitytest.GPUSlice(node, 2, feasibilitytest.Fixed("LATEST-GPU-MODEL"), "80Gi")
		for i := range s.Spec.Devices {
			if node == "n0" || i == 0 {
				s.Spec.Devices[i].Taints = []resourceapi.DeviceTaint{unhealthy}
			}
		}
		st.Slices = append(st.Slices, s)
	}
	// n0: both GPUs tainted; n1: gpu-0 tainted, gpu-1 healthy.
	request := func(count int64, tolerate bool) *resourceapi.ResourceClaimSpec {
		r := resourceapi.DeviceRequest{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}
		if tolerate {
			r.Exactly.Tolerations = []resourceapi.DeviceToleration{{Key: "gpu.example.com/unhealthy", Operator: resourceapi.DeviceTolerationOpExists}}
		}
		spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{r}}}
		resourceversion.Default(spec)
		return spec
	}
	view := New(st, celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema()))
	view.timeout = time.Minute
	for _, tc := range []struct {
		name string
		spec *resourceapi.ResourceClaimSpec
		want string
	}{
		{"one GPU: n1 has a healthy one", request(1, false), ""},
		{"two GPUs: only tainted ones", request(2, false),
			"it can only be satisfied by tainted devices (node n0: gpu.example.com/unhealthy=xid:NoSchedule); add tolerations for them to its requests, or wait until the devices are healthy again"},
		{"two GPUs tolerating the taint", request(2, true), ""},
		{"three GPUs: no node has them", request(3, false), "request gpus: 3 wanted, best node n0 has 2 matching"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := feasibilitytest.Allocatable(context.Background(), t, st, tc.spec); got != (tc.want == "") {
				t.Fatalf("test data is wrong: the allocator says feasible=%t", got)
			}
			msg, err := view.Unsatisfiable(context.Background(), "default", tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if msg != tc.want {
				t.Errorf("view says %q, want %q", msg, tc.want)
			}
		})
	}
}
