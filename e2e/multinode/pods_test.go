package multinode

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// pinned puts a pod manifest on one node.
func pinned(manifest, nodeName string) string {
	return strings.Replace(manifest, "\nspec:\n", "\nspec:\n  nodeSelector:\n    kubernetes.io/hostname: "+nodeName+"\n", 1)
}

// annotatedPod is a busybox pod (as framework's) with the given annotations.
func annotatedPod(name string, annotations map[string]string) string {
	var b strings.Builder
	for k, v := range annotations {
		fmt.Fprintf(&b, "    %s: %q\n", k, v)
	}
	return strings.Replace(framework.AnnotatedPod(name, 1), "  annotations:\n    gpu.example.com/count: \"1\"\n", "  annotations:\n"+b.String(), 1)
}

// apply creates the manifest in ns.
func apply(t *testing.T, c *framework.Cluster, ns, manifest string) {
	t.Helper()
	if out, err := c.KubectlStdin([]byte(manifest), "-n", ns, "apply", "-f", "-"); err != nil {
		t.Fatalf("apply: %v\n%s\n%s", err, out, manifest)
	}
}

// running waits for the pod to run and returns it with its claim.
func running(t *testing.T, c *framework.Cluster, ns, name string) (*corev1.Pod, *claimInfo) {
	t.Helper()
	pod := c.WaitForPodPhase(t, ns, name, 2*time.Minute, corev1.PodRunning)
	return pod, claimOf(t, c, pod)
}

// containerID is the pod's first container's ID and restart count, which stay the same as long
// as the container keeps running.
func containerID(t *testing.T, c *framework.Cluster, ns, name string) string {
	t.Helper()
	p, err := c.Clientset.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return containerOf(p)
}

// containerOf is the pod's first container: its ID, restart count and whether it runs.
func containerOf(p *corev1.Pod) string {
	if len(p.Status.ContainerStatuses) == 0 {
		return ""
	}
	s := p.Status.ContainerStatuses[0]
	return fmt.Sprintf("%s (restarts %d, running %v)", s.ContainerID, s.RestartCount, s.State.Running != nil)
}

// nodeNamed is the node of that name.
func nodeNamed(t *testing.T, nodes []node, name string) node {
	t.Helper()
	for _, n := range nodes {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no node %s among %v", name, nodes)
	return node{}
}
