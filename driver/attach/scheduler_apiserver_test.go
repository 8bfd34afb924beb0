package attach_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/driver/attach"
	"github.com/gpu-dra/gpu-dra/driver/faults"
	"github.com/gpu-dra/gpu-dra/driver/plugin"
	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/hack/buildenv"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

const driverName = "gpu.example.com"

// cluster is a control plane of the newest release (API server and scheduler, no kubelet) with a
// DeviceClass of the driver and a namespace.
type cluster struct {
	cs kubernetes.Interface
	ns string
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	srv := testapiserver.Start(t, testapiserver.WithAssetsDir(testapiserver.ReleaseAssetsDir(t, buildenv.Newest)))
	srv.StartScheduler(t, buildenv.Newest, []string{"dynamicresources", "BindingConditions", "binding", "schedule_one"}, "-v=4")
	c := &cluster{cs: srv.Clientset, ns: "attach"}
	ctx := context.Background()
	if _, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: driverName}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", driverName)}}},
	}}
	if _, err := c.cs.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

// addNode creates a Node the scheduler can place pods on and publishes its slice: count GPUs of
// an attachable node group, as the plugin publishes them where the API server keeps binding
// conditions (the probe must say so first).
func (c *cluster) addNode(t *testing.T, name string, count int) {
	t.Helper()
	ctx := context.Background()
	node, err := c.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")}
	node.Status.Allocatable = node.Status.Capacity
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if node, err = c.cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server taints a new node not-ready until a kubelet reports; there is none.
	node.Spec.Taints = nil
	if _, err := c.cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	slices := c.cs.ResourceV1().ResourceSlices()
	if reason, err := plugin.ProbeBindingConditions(ctx, slices, driverName, name); err != nil || reason != "" {
		t.Fatalf("ProbeBindingConditions on %s = %q, %v; want the fields kept", buildenv.Newest, reason, err)
	}
	devices, err := simulated.New(name, nodegroups.GroupSpec{Count: count, Sharing: &nodegroups.Sharing{Mode: nodegroups.Attachable}}).Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-gpus"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: driverName, NodeName: ptr.To(name), Pool: resourceapi.ResourcePool{Name: name, ResourceSliceCount: 1}, Devices: devices,
	}}
	got, err := slices.Create(ctx, slice, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Devices[0].BindingConditions) == 0 {
		t.Fatalf("the API server dropped the binding conditions of %s", name)
	}
}

// runAttacher runs the attacher of a node until the test ends; faulty names its devices whose
// attach fails.
func (c *cluster) runAttacher(t *testing.T, node string, faulty ...string) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	f := faults.Faults{}
	for _, d := range faulty {
		f[d] = faults.Fault{Kind: faults.KindAttachFailure, Time: metav1.Now(), Message: "simulated"}
	}
	a := attach.New(c.cs, driverName, node, attach.WithFaults(func() faults.Faults { return f }))
	var wg sync.WaitGroup
	wg.Go(func() { a.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// createPod creates a claim for one GPU and a pod using it.
func (c *cluster) createPod(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns}, Spec: resourceapi.ResourceClaimSpec{
		Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driverName}}}},
	}}
	if _, err := c.cs.ResourceV1().ResourceClaims(c.ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns}, Spec: corev1.PodSpec{
		Containers:     []corev1.Container{{Name: "ctr", Image: "busybox", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
		ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name)}},
	}}
	if _, err := c.cs.CoreV1().Pods(c.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (c *cluster) claim(t *testing.T, name string) *resourceapi.ResourceClaim {
	t.Helper()
	claim, err := c.cs.ResourceV1().ResourceClaims(c.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return claim
}

func (c *cluster) podNode(t *testing.T, name string) string {
	t.Helper()
	pod, err := c.cs.CoreV1().Pods(c.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod.Spec.NodeName
}

func poll(t *testing.T, timeout time.Duration, what string, done func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return done(), nil })
	if err != nil {
		t.Fatalf("%s: not within %s", what, timeout)
	}
}

// TestSchedulerWaitsForAttach: the real scheduler allocates an attachable GPU and then waits in
// PreBind: the pod stays unbound while its claim is allocated and reserved, through more than one
// of the scheduler's 5-second checks, until the attacher reports the GPU attached; then the pod is
// bound to the node.
func TestSchedulerWaitsForAttach(t *testing.T) {
	c := newCluster(t)
	c.addNode(t, "node-a", 2)
	c.createPod(t, "pod0")
	poll(t, time.Minute, "claim pod0 allocated and reserved", func() bool {
		claim := c.claim(t, "pod0")
		return claim.Status.Allocation != nil && len(claim.Status.ReservedFor) == 1
	})
	claim := c.claim(t, "pod0")
	r := claim.Status.Allocation.Devices.Results[0]
	if fmt.Sprint(r.BindingConditions, r.BindingFailureConditions) != "[Attached] [AttachFailed]" || claim.Status.Allocation.AllocationTimestamp == nil {
		t.Fatalf("allocation %+v, want the device's binding conditions copied and a timestamp", claim.Status.Allocation)
	}
	time.Sleep(7 * time.Second)
	if n := c.podNode(t, "pod0"); n != "" {
		t.Fatalf("pod0 bound to %s before its GPU was attached", n)
	}
	c.runAttacher(t, "node-a")
	poll(t, time.Minute, "pod0 bound to node-a after the attach", func() bool { return c.podNode(t, "pod0") == "node-a" })
	claim = c.claim(t, "pod0")
	cond := attach.TrueCondition(claim, "Attached")
	if cond == nil || cond.Reason != attach.ReasonAttached || claim.Status.Devices[0].Device != r.Device {
		t.Errorf("status.devices %+v, want %s Attached=True", claim.Status.Devices, r.Device)
	}
}

// TestSchedulerRetriesFailedAttach: every attach on node-a fails. The scheduler sees AttachFailed,
// gives up the pod's binding, deallocates the claim and tries again; once node-b (whose attaches
// work) has GPUs, the pod ends up bound there, its claim allocated from node-b.
func TestSchedulerRetriesFailedAttach(t *testing.T) {
	c := newCluster(t)
	c.addNode(t, "node-a", 1)
	c.runAttacher(t, "node-a", "gpu-0")
	c.createPod(t, "pod0")
	poll(t, time.Minute, "claim pod0 allocated on node-a and its attach failed", func() bool {
		return attach.TrueCondition(c.claim(t, "pod0"), "AttachFailed") != nil
	})
	poll(t, time.Minute, "claim pod0 deallocated after the failed attach", func() bool {
		return c.claim(t, "pod0").Status.Allocation == nil
	})
	if n := c.podNode(t, "pod0"); n != "" {
		t.Fatalf("pod0 bound to %s although its attach failed", n)
	}
	c.addNode(t, "node-b", 1)
	c.runAttacher(t, "node-b")
	poll(t, 3*time.Minute, "pod0 bound to node-b", func() bool { return c.podNode(t, "pod0") == "node-b" })
	claim := c.claim(t, "pod0")
	if r := claim.Status.Allocation.Devices.Results; len(r) != 1 || r[0].Pool != "node-b" || attach.TrueCondition(claim, "Attached") == nil {
		t.Errorf("claim %+v, want allocated from node-b and attached", claim.Status)
	}
}
