package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

const (
	pluginSelector  = "app.kubernetes.io/component=kubelet-plugin"
	webhookSelector = "app.kubernetes.io/component=webhook"
	groupLabel      = "gpu.example.com/group"
)

// TestPartialFailure installs the chart with a second node group and checks what must keep
// working when parts of the product change or fail: a node relabelled into another group is
// re-published by the running plugin, and with the webhook down only this driver's claims and
// annotated pods are refused.
func TestPartialFailure(t *testing.T) {
	c := framework.Setup(t)
	version := c.NewestResourceVersion(t)
	probe := filepath.Join("testdata", "seed", seedTemplate(version))
	installForTest(t, c, version,
		"--set", "inventory.nodeGroups[0].name=small",
		"--set", `inventory.nodeGroups[0].nodeSelector.gpu\.example\.com/group=small`,
		"--set", "inventory.nodeGroups[0].count=4",
		"--set", "inventory.nodeGroups[0].model=SMALL-GPU-MODEL",
		"--set", "inventory.nodeGroups[0].memory=40Gi")

	t.Run("admission policies type-check", func(t *testing.T) {
		// kube-controller-manager type-checks each policy against the kinds it matches; a
		// warning means an expression that cannot work as written.
		for _, p := range []string{"gpu-dra-kubelet-plugin-own-node", "gpu-dra-webhook-cabundle-only"} {
			framework.Eventually(t, time.Minute, "type checking of "+p, func() (bool, error) {
				out, err := c.KubectlErr("get", "validatingadmissionpolicy", p, "-o", "jsonpath={.status.typeChecking}")
				return out != "", err
			})
			if w := c.Kubectl(t, "get", "validatingadmissionpolicy", p, "-o", "jsonpath={.status.typeChecking.expressionWarnings}"); w != "" {
				t.Errorf("policy %s: type-checking warnings: %s", p, w)
			}
		}
	})

	t.Run("node relabelled into another group is re-published without a restart", func(t *testing.T) {
		node := nodeName(t, c)
		before := pluginPods(t, c)
		waitDevices(t, c, version, 8, "LATEST-GPU-MODEL")
		t.Cleanup(func() { c.KubectlErr("label", "node", node, groupLabel+"-") })
		c.Kubectl(t, "label", "node", node, groupLabel+"=small", "--overwrite")
		waitDevices(t, c, version, 4, "SMALL-GPU-MODEL")
		c.Kubectl(t, "label", "node", node, groupLabel+"-")
		waitDevices(t, c, version, 8, "LATEST-GPU-MODEL")
		if after := pluginPods(t, c); after != before {
			t.Errorf("the plugin restarted: pods (uid/restarts) %s, then %s", before, after)
		}
		logs := c.Kubectl(t, "-n", releaseNS, "logs", "-l", pluginSelector, "--tail=-1")
		if strings.Contains(logs, "forbidden") {
			t.Errorf("the plugin logged forbidden requests:\n%s", grepLines(logs, "forbidden"))
		}
	})

	t.Run("webhook down: only this driver's claims and annotated pods are refused", func(t *testing.T) {
		ns := c.Namespace(t, "outage")
		c.Kubectl(t, "-n", ns, "apply", "-f", probe) // admitted while the webhook is up
		otherClass := "e2e-other-driver-" + ns
		class := fmt.Sprintf(`apiVersion: resource.k8s.io/%s
kind: DeviceClass
metadata:
  name: %s
spec:
  selectors:
  - cel:
      expression: device.driver == "test-driver.cdi.k8s.io"
`, version, otherClass)
		if out, err := c.KubectlStdin([]byte(class), "apply", "-f", "-"); err != nil {
			t.Fatalf("create DeviceClass: %v\n%s", err, out)
		}
		t.Cleanup(func() { c.KubectlErr("delete", "deviceclass", otherClass, "--ignore-not-found") })

		c.Kubectl(t, "-n", releaseNS, "scale", "deployment", release+"-webhook", "--replicas=0")
		t.Cleanup(func() {
			c.Kubectl(t, "-n", releaseNS, "scale", "deployment", release+"-webhook", "--replicas=2")
			c.Kubectl(t, "-n", releaseNS, "rollout", "status", "deployment/"+release+"-webhook", "--timeout=2m")
			framework.Eventually(t, time.Minute, "the webhook to answer again", func() (bool, error) {
				_, err := c.KubectlErr("apply", "--dry-run=server", "-f", probe)
				return err == nil, err
			})
		})
		c.Kubectl(t, "-n", releaseNS, "wait", "--for=delete", "pod", "-l", webhookSelector, "--timeout=2m")

		start := time.Now()
		if out, err := c.KubectlStdin([]byte(claim(version, "other-driver", otherClass)), "-n", ns, "create", "-f", "-"); err != nil {
			t.Errorf("a claim for another driver's class was refused: %v\n%s", err, out)
		}
		t.Logf("claim for another driver's class admitted in %s", time.Since(start).Round(time.Millisecond))

		// The resourceclaim controller's claim for a pod from the template admitted earlier.
		if out, err := c.KubectlStdin([]byte(framework.TemplatePod("from-template", "example")), "-n", ns, "apply", "-f", "-"); err != nil {
			t.Fatalf("pod from an admitted template: %v\n%s", err, out)
		}
		c.WaitForPodPhase(t, ns, "from-template", 2*time.Minute, corev1.PodRunning)
		if env := c.GPUEnv(t, ns, "from-template"); len(env) != 1 {
			t.Errorf("pod from the template sees %q, want one GPU_DEVICE_<i>", env)
		}

		out, err := c.KubectlStdin([]byte(claim(version, "ours", driver)), "-n", ns, "create", "-f", "-")
		if err == nil || !strings.Contains(err.Error(), `"resourceclaims.`+driver+`"`) {
			t.Errorf("a claim for %s with the webhook down: err = %v, want refused by webhook resourceclaims.%s\n%s", driver, err, driver, out)
		}
		out, err = c.KubectlStdin([]byte(framework.AnnotatedPod("annotated", 1)), "-n", ns, "create", "-f", "-")
		if err == nil || !strings.Contains(err.Error(), `"pods.`+driver+`"`) {
			t.Errorf("an annotated pod with the webhook down: err = %v, want refused by webhook pods.%s\n%s", err, driver, out)
		}
		c.Kubectl(t, "-n", ns, "delete", "pod", "from-template", "--wait=true")
	})
}

// claim is a ResourceClaim of one device of class in the served version's shape.
func claim(version, name, class string) string {
	request := "    - name: gpu\n      exactly:\n        deviceClassName: " + class + "\n"
	if version == "v1beta1" {
		request = "    - name: gpu\n      deviceClassName: " + class + "\n"
	}
	return fmt.Sprintf("apiVersion: resource.k8s.io/%s\nkind: ResourceClaim\nmetadata:\n  name: %s\nspec:\n  devices:\n    requests:\n%s", version, name, request)
}

func nodeName(t *testing.T, c *framework.Cluster) string {
	t.Helper()
	if c.NodeName != "" {
		return c.NodeName
	}
	nodes, err := c.Clientset.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 {
		t.Fatalf("want a single-node cluster: %v", err)
	}
	return nodes.Items[0].Name
}

// pluginPods is "uid:restarts" of every plugin pod.
func pluginPods(t *testing.T, c *framework.Cluster) string {
	t.Helper()
	return c.Kubectl(t, "-n", releaseNS, "get", "pods", "-l", pluginSelector, "-o",
		`jsonpath={range .items[*]}{.metadata.uid}:{.status.containerStatuses[0].restartCount} {end}`)
}

func waitDevices(t *testing.T, c *framework.Cluster, version string, count int, model string) {
	t.Helper()
	framework.Eventually(t, 2*time.Minute, fmt.Sprintf("%d devices of model %s published", count, model), func() (bool, error) {
		devices, err := driverDevices(c, version)
		if err != nil || len(devices) != count {
			return false, fmt.Errorf("%d devices (%v)", len(devices), err)
		}
		for _, d := range devices {
			if d.Model != model {
				return false, fmt.Errorf("device %s has model %s", d.Name, d.Model)
			}
		}
		return true, nil
	})
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
