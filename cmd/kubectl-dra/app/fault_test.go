package app

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

func TestParseDeviceRef(t *testing.T) {
	for ref, want := range map[string]string{
		"worker-1/gpu-3":     "",
		"a.b.c/gpu-0":        "",
		"worker-1":           "want NODE/DEVICE",
		"/gpu-3":             "want NODE/DEVICE",
		"worker-1/":          "want NODE/DEVICE",
		"Worker_1/gpu-3":     "is not a node name",
		"worker-1/GPU_3":     "is not a device name",
		"worker-1/gpu-3/foo": "is not a device name",
	} {
		_, _, err := parseDeviceRef(ref)
		if (err == nil) != (want == "") || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("%q: error %v, want %q", ref, err, want)
		}
	}
}

// TestFaultAgainstCluster runs `kubectl dra fault` and `status` against a real API server holding
// one node's slice (as the plugin publishes it) and the chart's (empty) faults ConfigMap: the
// node's faults go to its own ConfigMap, which its last clear deletes.
func TestFaultAgainstCluster(t *testing.T) {
	srv := testapiserver.Start(t)
	ctx := context.Background()
	cs := srv.Clientset
	devices, err := simulated.New("las1", nodegroups.GroupSpec{}).Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slice := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "las1-gpu"},
		Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.example.com", NodeName: ptr.To("las1"),
			Pool: resourceapi.ResourcePool{Name: "las1", ResourceSliceCount: 1}, Devices: devices},
	}
	if _, err := draclient.New(cs).ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gpu-dra"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps("gpu-dra").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gpu-dra-faults"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeconfig := writeKubeconfig(t, srv.Config)
	t.Setenv("KUBECONFIG", "")
	dra := func(args ...string) result { return run(t, "", append(args, "--kubeconfig", kubeconfig)...) }
	// entry is las1's faults, in its own ConfigMap.
	entry := func() string {
		cm, err := cs.CoreV1().ConfigMaps("gpu-dra").Get(ctx, "gpu-dra-faults-las1", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		return cm.Data["las1"]
	}

	if r := dra("fault", "set", "las1/gpu-3", "--kind", "xid", "--message", "XID 79"); r.code != 0 || !strings.Contains(r.stdout, "Fault xid set on las1/gpu-3") {
		t.Fatalf("set: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if e := entry(); !strings.Contains(e, "gpu-3:") || !strings.Contains(e, "kind: xid") || !strings.Contains(e, "message: XID 79") {
		t.Errorf("entry after set:\n%s", e)
	}
	r := dra("status")
	if r.code != 0 || !strings.Contains(r.stdout, "fault xid (not tainted)") {
		t.Errorf("status does not show the untainted fault: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "LATEST-GPU-MODEL\t8\t7\t0\t1") && !strings.Contains(strings.Join(strings.Fields(r.stdout), " "), "LATEST-GPU-MODEL 8 7 0 1") {
		t.Errorf("totals do not count the faulty GPU as unhealthy:\n%s", r.stdout)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"fault", "set", "las1/gpu-9", "--kind", "xid"}, "node las1 publishes no device gpu-9 of driver gpu.example.com; it publishes gpu-0, gpu-1"},
		{[]string{"fault", "set", "las2/gpu-1", "--kind", "xid"}, "node las2 publishes no devices of driver gpu.example.com"},
		{[]string{"fault", "set", "las1/gpu-1", "--kind", "melted"}, `--kind: unknown fault kind "melted"; known kinds: xid, fallen-off`},
		{[]string{"fault", "set", "las1/gpu-1", "--kind", "xid", "-n", "elsewhere"}, "ConfigMap elsewhere/gpu-dra-faults not found: install the chart with health.simulatedFaults=true"},
		{[]string{"fault", "set", "las1/gpu-1", "--kind", "xid", "--message", strings.Repeat("x", 2000)}, "--message:"},
	} {
		before := entry()
		if r := dra(tc.args...); r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error containing %q", tc.args, r.code, r.stderr, tc.want)
		}
		if entry() != before {
			t.Errorf("%v changed the entry", tc.args)
		}
	}

	if r := dra("fault", "list"); r.code != 0 || !strings.Contains(strings.Join(strings.Fields(r.stdout), " "), "las1 gpu-3 xid") {
		t.Errorf("list: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := dra("fault", "clear", "las1/gpu-3"); r.code != 0 || !strings.Contains(r.stdout, "Fault of las1/gpu-3 cleared") {
		t.Errorf("clear: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if _, err := cs.CoreV1().ConfigMaps("gpu-dra").Get(ctx, "gpu-dra-faults-las1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the node's ConfigMap is left after its last fault was cleared (%v)", err)
	}
	if r := dra("fault", "clear", "las1/gpu-3"); r.code != 0 || !strings.Contains(r.stdout, "las1/gpu-3 has no fault") {
		t.Errorf("second clear: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
