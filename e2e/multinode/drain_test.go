package multinode

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// A Deployment's pod with a GPU from the seed's template: what a drain must move.
const drainDeployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: gpu-app
spec:
  replicas: 1
  selector: {matchLabels: {app: gpu-app}}
  template:
    metadata:
      labels: {app: gpu-app}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: app
        image: docker.io/library/busybox:1.35
        imagePullPolicy: Never
        command: ["sh", "-c", "trap exit INT TERM; sleep 3600 & wait"]
        resources:
          claims: [{name: gpu}]
      resourceClaims:
      - name: gpu
        resourceClaimTemplateName: example
`

// TestDrainGPUNode drains the node a GPU pod of a Deployment runs on (`kubectl drain`, evictions
// honoring the webhook's PodDisruptionBudget): the pod comes back on another node with a new
// claim prepared there, the old claim is deleted and its node's plugin unprepares it (nothing
// left in that node's CDI directory or checkpoint), and the drained node's plugin stays.
func TestDrainGPUNode(t *testing.T) {
	c, nodes := setup(t, 2)
	install(t, c, nodes)
	ctx := context.Background()
	ns := c.Namespace(t, "drain")
	c.Kubectl(t, "-n", ns, "apply", "-f", filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml"))
	apply(t, c, ns, drainDeployment)
	oldPod := appPod(t, c, ns, "")
	pod, oldClaim := running(t, c, ns, oldPod)
	drained := nodeNamed(t, nodes, pod.Spec.NodeName)
	if spec, entry := drained.holds(t, oldClaim.UID); !spec || !entry {
		t.Fatalf("before the drain, %s has the claim: CDI spec %v, checkpoint entry %v", drained.Name, spec, entry)
	}
	plugin := pluginPods(t, c)[drained.Name]
	t.Cleanup(func() { c.Kubectl(t, "uncordon", drained.Name) })

	start := time.Now()
	out := c.Kubectl(t, "drain", drained.Name, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=3m")
	t.Logf("kubectl drain %s (%s):\n%s", drained.Name, time.Since(start).Round(time.Second), out)

	newPod := appPod(t, c, ns, oldPod)
	moved, newClaim := running(t, c, ns, newPod)
	if moved.Spec.NodeName == drained.Name {
		t.Fatalf("the new pod %s runs on the drained node %s", newPod, drained.Name)
	}
	if newClaim.UID == oldClaim.UID {
		t.Errorf("the new pod has the old claim %s", oldClaim.Name)
	}
	target := nodeNamed(t, nodes, moved.Spec.NodeName)
	if spec, entry := target.holds(t, newClaim.UID); !spec || !entry {
		t.Errorf("node %s prepared the new claim: CDI spec %v, checkpoint entry %v", target.Name, spec, entry)
	}
	if env := c.GPUEnv(t, ns, newPod); len(env) != 1 {
		t.Errorf("the new pod sees %v, want one GPU", env)
	}
	framework.Eventually(t, time.Minute, "the old claim deleted and unprepared on "+drained.Name, func() (bool, error) {
		_, err := c.Clientset.ResourceV1().ResourceClaims(ns).Get(ctx, oldClaim.Name, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("claim %s still there (%v)", oldClaim.Name, err)
		}
		if spec, entry := drained.holds(t, oldClaim.UID); spec || entry {
			return false, fmt.Errorf("%s still holds it: CDI spec %v, checkpoint entry %v", drained.Name, spec, entry)
		}
		return true, nil
	})
	if now := pluginPods(t, c)[drained.Name]; now.UID != plugin.UID {
		t.Errorf("the drained node's plugin pod %s was replaced by %s", plugin.Name, now.Name)
	}
	t.Logf("pod %s on %s (claim %s) -> pod %s on %s (claim %s) in %s", oldPod, drained.Name, oldClaim.Name,
		newPod, target.Name, newClaim.Name, time.Since(start).Round(time.Second))
}

// appPod waits for a running pod of the Deployment gpu-app other than except and returns its name.
func appPod(t *testing.T, c *framework.Cluster, ns, except string) string {
	t.Helper()
	var name string
	framework.Eventually(t, 3*time.Minute, "a running pod of the Deployment but "+except, func() (bool, error) {
		pods, err := c.Clientset.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=gpu-app"})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if p.Name != except && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				name = p.Name
				return true, nil
			}
		}
		return false, fmt.Errorf("%d pods, none running but %q", len(pods.Items), except)
	})
	return name
}
