package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// The harness's own smoke tests: a pod's output comes back through kubectl logs, pods reach the
// API server through the kubernetes Service, and DRA with CDI works with the upstream test driver.

func TestPodLogs(t *testing.T) {
	c := framework.Setup(t)
	ns := c.Namespace(t, "smoke")
	line := fmt.Sprintf("hello from %s at %d", ns, time.Now().UnixNano())
	c.Kubectl(t, "-n", ns, "run", "echo", "--image=docker.io/library/busybox:1.35", "--image-pull-policy=Never",
		"--restart=Never", "--command", "--", "sh", "-c", "echo '"+line+"'")
	c.WaitForPodPhase(t, ns, "echo", 2*time.Minute, corev1.PodSucceeded)
	if got := strings.TrimSpace(c.Kubectl(t, "-n", ns, "logs", "echo")); got != line {
		t.Errorf("kubectl logs = %q, want %q", got, line)
	}
}

func TestPodReachesAPIServerThroughService(t *testing.T) {
	c := framework.Setup(t)
	ns := c.Namespace(t, "smoke")
	c.Kubectl(t, "-n", ns, "run", "probe", "--image=gpu-dra.local/apiprobe:dev", "--image-pull-policy=Never", "--restart=Never")
	c.WaitForPodPhase(t, ns, "probe", 2*time.Minute, corev1.PodSucceeded)
	svc, err := c.Clientset.CoreV1().Services("default").Get(context.Background(), "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("reached via https://%s:443", svc.Spec.ClusterIP)
	if got := c.Kubectl(t, "-n", ns, "logs", "probe"); !strings.Contains(got, want) {
		t.Errorf("probe output %q does not contain %q", got, want)
	}
}

func TestDRAWithUpstreamTestDriver(t *testing.T) {
	c := framework.Setup(t)
	c.RequireLocal(t, "runs the upstream DRA test driver as a kubelet plugin on the node")
	version := c.NewestResourceVersion(t)
	ctx := context.Background()

	pluginDir := "/var/lib/kubelet/plugins/test-driver.cdi.k8s.io"
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(c.K8sBin, "dra-test-driver")
	args := []string{"--kubeconfig=" + c.Kubeconfig, "-v=3", "kubelet-plugin", "--node-name=" + c.NodeName}
	help, _ := framework.Run(t, 30*time.Second, bin, "kubelet-plugin", "--help")
	if strings.Contains(help, "--num-devices") {
		args = append(args, "--num-devices=2")
	} else {
		t.Logf("this release's test driver publishes no devices itself; publishing them from testdata")
		c.Kubectl(t, "apply", "-f", filepath.Join("testdata", "dra-test-driver-slice."+version+".yaml"))
	}
	framework.HostProcess(t, bin, args...)
	t.Cleanup(func() {
		c.KubectlErr("delete", "resourceslices", "--field-selector", "spec.driver=test-driver.cdi.k8s.io", "--wait=false")
		c.KubectlErr("delete", "deviceclass", "e2e-test-driver", "--ignore-not-found")
	})
	framework.Eventually(t, time.Minute, "the test driver's ResourceSlice", func() (bool, error) {
		out, err := c.KubectlErr("get", "resourceslices", "--field-selector", "spec.driver=test-driver.cdi.k8s.io", "-o", "name")
		return strings.TrimSpace(out) != "", err
	})

	ns := c.Namespace(t, "dra-smoke")
	c.Kubectl(t, "-n", ns, "apply", "-f", filepath.Join("testdata", "dra-test-driver."+version+".yaml"))
	c.Kubectl(t, "-n", ns, "apply", "-f", filepath.Join("testdata", "dra-test-driver-pod.yaml"))
	c.WaitForPodPhase(t, ns, "dra-pod", 2*time.Minute, corev1.PodRunning)

	framework.Eventually(t, 30*time.Second, "the container's env dump", func() (bool, error) {
		out, err := c.KubectlErr("-n", ns, "logs", "dra-pod", "-c", "with-claim")
		return strings.Contains(out, "---"), err
	})
	with := c.Kubectl(t, "-n", ns, "logs", "dra-pod", "-c", "with-claim")
	if !strings.Contains(with, "user_a=b") {
		t.Errorf("container with the claim lacks user_a=b from the driver's CDI spec; env:\n%s", with)
	}
	if without := c.Kubectl(t, "-n", ns, "logs", "dra-pod", "-c", "without-claim"); strings.Contains(without, "user_a=b") {
		t.Errorf("container without the claim sees the claim's env:\n%s", without)
	}
	// Unprepare must run while the driver still does: delete the pod before the driver stops.
	defer func() {
		c.Kubectl(t, "-n", ns, "delete", "pod", "dra-pod", "--wait=true")
		framework.Eventually(t, time.Minute, "the test driver's CDI spec to be removed", func() (bool, error) {
			files, _ := filepath.Glob("/var/run/cdi/test-driver.cdi.k8s.io-*")
			return len(files) == 0, nil
		})
	}()
	claims, err := c.Clientset.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if version != "v1" {
		t.Logf("cluster serves resource.k8s.io %s: claim state checked through kubectl", version)
		out := c.Kubectl(t, "-n", ns, "get", "resourceclaims")
		if !strings.Contains(out, "allocated,reserved") {
			t.Errorf("claim not allocated,reserved:\n%s", out)
		}
	} else if err != nil || len(claims.Items) != 1 || claims.Items[0].Status.Allocation == nil {
		t.Errorf("want one allocated claim, got %v (err %v)", claims, err)
	}
}
