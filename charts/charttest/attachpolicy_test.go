package charttest

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra/driver/attach"
	"github.com/gpu-dra/gpu-dra/hack/buildenv"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// TestAttachUnderClaimStatusPolicy runs the attacher of node-a as the plugin of node-a (its service
// account with the node claim of a pod-bound token) under the chart's RBAC and admission policies on
// the newest release: its Attached condition lands on a claim allocated to node-a, beside another
// driver's entry that stays as it was. The same write as the plugin of node-b, for node-a's claim,
// is refused: by the chart's policy on the seed's release, and first by the API server's own
// per-node check on the newest (DRAResourceClaimGranularStatusAuthorization).
func TestAttachUnderClaimStatusPolicy(t *testing.T) {
	for _, release := range []string{buildenv.Seed, buildenv.Newest} {
		t.Run(release, func(t *testing.T) { testAttachUnderClaimStatusPolicy(t, release) })
	}
}

func testAttachUnderClaimStatusPolicy(t *testing.T, release string) {
	srv := testapiserver.Start(t, testapiserver.WithAssetsDir(testapiserver.ReleaseAssetsDir(t, release)))
	installPluginRights(t, srv, "v"+release)
	ctx := t.Context()
	claims := srv.Clientset.ResourceV1().ResourceClaims(claimNamespace)

	// The policy takes effect a few seconds after its creation: the forged write is tried on a
	// claim of its own until it is refused.
	probe := attachableClaim(t, srv, "probe")
	nodeB := kubernetes.NewForConfigOrDie(impersonate(srv.Config, "gpu-dra-kubelet-plugin", map[string][]string{nodeClaim: {"node-b"}}))
	forged := []attach.Result{{Target: attach.Target{Pool: "node-a", Device: "gpu-0"},
		Conditions: attach.Outcome(attach.Target{Conditions: []string{"Attached"}}, "node-a", nil, time.Now())}}
	var err error
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err = attach.Write(ctx, nodeB, "gpu.example.com", probe, forged)
		return err != nil, nil
	})
	if err == nil || !strings.Contains(err.Error(), "claim probe is not") && (release != buildenv.Newest || !strings.Contains(err.Error(), "cannot arbitrary-node:patch")) {
		t.Errorf("node-b's plugin attaching node-a's device: %v, want refused by %s", err, claimPolicy)
	}
	claim := attachableClaim(t, srv, "attach")
	if len(claim.Status.Allocation.Devices.Results[0].BindingConditions) == 0 {
		t.Logf("Kubernetes %s drops binding conditions (DRADeviceBindingConditions off): no attach to make", release)
		return
	}

	_, actx := ktesting.NewTestContext(t)
	actx, cancel := context.WithCancel(actx)
	defer cancel()
	nodeA := kubernetes.NewForConfigOrDie(impersonate(srv.Config, "gpu-dra-kubelet-plugin", map[string][]string{nodeClaim: {"node-a"}}))
	go attach.New(nodeA, "gpu.example.com", "node-a").Run(actx)
	var got *resourceapi.ResourceClaim
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err = claims.Get(ctx, "attach", metav1.GetOptions{})
		return err == nil && len(got.Status.Devices) == 2, err
	}); err != nil {
		t.Fatalf("the attach of node-a's plugin never landed: %v", err)
	}
	for _, d := range got.Status.Devices {
		switch {
		case d.Driver == otherDriver && (len(d.Conditions) != 1 || d.Conditions[0].Type != "Ready"):
			t.Errorf("the other driver's entry changed: %+v", d)
		case d.Driver == "gpu.example.com" && (d.Device != "gpu-0" || len(d.Conditions) != 1 || d.Conditions[0].Type != "Attached" || d.Conditions[0].Status != metav1.ConditionTrue):
			t.Errorf("the attacher's entry %+v, want gpu-0 Attached=True", d)
		}
	}
}

// attachableClaim creates a claim allocated one attachable GPU of node-a and another driver's
// device, whose status.devices entry has a condition.
func attachableClaim(t *testing.T, srv *testapiserver.Server, name string) *resourceapi.ResourceClaim {
	t.Helper()
	ctx := t.Context()
	claims := srv.Clientset.ResourceV1().ResourceClaims(claimNamespace)
	claim, err := claims.Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.ResourceClaimSpec{
		Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.example.com"}}}},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	claim.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-0", BindingConditions: []string{"Attached"}, BindingFailureConditions: []string{"AttachFailed"}},
			{Request: "gpu", Driver: otherDriver, Pool: "node-a", Device: "eth0"},
		}},
		NodeSelector:        nodeSelector("node-a"),
		AllocationTimestamp: &now,
	}
	claim.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: otherDriver, Pool: "node-a", Device: "eth0",
		Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Up", LastTransitionTime: now}}}}
	if claim, err = claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return claim
}

// nodeSelector is the node selector the scheduler writes for an allocation from node's own slices.
func nodeSelector(node string) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
		{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}},
	}}}}
}
