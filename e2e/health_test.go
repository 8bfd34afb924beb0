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
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/driver/faults"
	"github.com/gpu-dra/gpu-dra/e2e/framework"
	"github.com/gpu-dra/gpu-dra/internal/manifest"
)

const (
	taintKey = driver + "/unhealthy"
	// taintsDroppedLine is the plugin's one line where the API server drops device taints.
	taintsDroppedLine = "Device taints are not published"
	// healthDeadline is the bar: a fault shows on the device and in the pod within it.
	healthDeadline = 10 * time.Second
)

// TestHealth installs the chart with fallen-off faults evicting (health.noExecuteKinds) and injects
// faults with `kubectl dra fault` on the GPUs running pods hold. Where the API server keeps device
// taints (1.36+, DRADeviceTaints): within 10 s the device carries gpu.example.com/unhealthy=xid:
// NoSchedule, a new pod gets another GPU, a claim pinned to the faulty GPU waits (and the webhook
// says only tainted devices could satisfy it); a fallen-off fault evicts the pod without a
// toleration and keeps the one with it; clearing removes the taint and the pinned claim gets the
// GPU. Where the kubelet reports resource health (ResourceHealthStatus, 1.36+) the pod's container
// status shows the device Healthy, then Unhealthy within 10 s. Everywhere: the pods get a
// DeviceUnhealthy Event and the metrics count the device unhealthy. Elsewhere the same install
// runs, no taint appears, and the plugin says once why. Each node's faults are in a ConfigMap of
// their own, gone with the node's last fault; one left set at the end is gone after uninstall.
func TestHealth(t *testing.T) {
	c := framework.Setup(t)
	version := c.NewestResourceVersion(t)
	// Registered before the install's cleanup, so it runs after the uninstall.
	t.Cleanup(func() { checkNoFaultsLeft(t, c) })
	installSharing(t, c, version, "health.noExecuteKinds={fallen-off}")
	taintsKept := deviceTaintsKept(t, c)
	t.Logf("resource.k8s.io/%s; the API server keeps device taints: %v", version, taintsKept)

	ns := c.Namespace(t, "health")
	applyVersioned(t, c, ns, version, templatesYAML)
	applyPods(t, c, ns, framework.TemplatePod("victim", "one-gpu"))
	c.WaitForPodPhase(t, ns, "victim", 2*time.Minute, corev1.PodRunning)
	node, dev := podDevice(t, c, ns, "victim")
	t.Logf("pod victim holds %s/%s", node, dev)
	statusServed := waitHealthStatus(t, c, ns, "victim", dev, "Healthy", time.Minute) == nil
	t.Logf("the kubelet reports resource health in pod status: %v", statusServed)

	start := time.Now()
	faulted := []string{node + "/" + dev}
	kubectlDra(t, c, "fault", "set", node+"/"+dev, "--kind", "xid", "--message", "XID 79: e2e")
	t.Run("taint", func(t *testing.T) {
		want := ""
		if taintsKept {
			want = taintKey + "=xid:NoSchedule"
			framework.Eventually(t, healthDeadline, "the taint on "+dev, func() (bool, error) { return deviceTaint(t, c, dev) == want, nil })
			t.Logf("tainted after %s", time.Since(start).Round(100*time.Millisecond))
		} else {
			time.Sleep(healthDeadline)
		}
		if got := deviceTaint(t, c, dev); got != want {
			t.Errorf("%s has taint %q, want %q", dev, got, want)
		}
	})
	t.Run("pod status", func(t *testing.T) {
		if !statusServed {
			pod, _ := c.Clientset.CoreV1().Pods(ns).Get(context.Background(), "victim", metav1.GetOptions{})
			if pod != nil && len(pod.Status.ContainerStatuses) > 0 && len(pod.Status.ContainerStatuses[0].AllocatedResourcesStatus) > 0 {
				t.Errorf("allocatedResourcesStatus %+v, although it never said Healthy", pod.Status.ContainerStatuses[0].AllocatedResourcesStatus)
			}
			return
		}
		if err := waitHealthStatus(t, c, ns, "victim", dev, "Unhealthy", healthDeadline+time.Since(start)); err != nil {
			t.Error(err)
		}
		t.Logf("pod status Unhealthy after %s", time.Since(start).Round(100*time.Millisecond))
	})
	t.Run("pod event", func(t *testing.T) {
		waitForEvent(t, c, ns, "victim", "DeviceUnhealthy")
	})
	t.Run("metrics", func(t *testing.T) {
		framework.Eventually(t, 30*time.Second, "the plugin's device metrics", func() (bool, error) {
			m := pluginMetrics(t, c)
			return strings.Contains(m, `gpu_dra_plugin_devices{health="unhealthy"} 1`) && strings.Contains(m, `gpu_dra_plugin_device_faults{kind="xid"} 1`), nil
		})
	})

	t.Run("the node's own ConfigMap", func(t *testing.T) {
		cms := c.Clientset.CoreV1().ConfigMaps(releaseNS)
		cm, err := cms.Get(context.Background(), faults.ObjectName(faultsConfigMap, node), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the node's faults ConfigMap: %v", err)
		}
		if !strings.Contains(cm.Data[node], dev+":") || cm.Labels[faults.SetLabel] != faultsConfigMap {
			t.Errorf("%s holds %v with the labels %v", cm.Name, cm.Data, cm.Labels)
		}
		if chart, err := cms.Get(context.Background(), faultsConfigMap, metav1.GetOptions{}); err != nil || len(chart.Data) != 0 {
			t.Errorf("the chart's faults ConfigMap: %v, data %v; want it there and empty", err, chart)
		}
		if out := kubectlDra(t, c, "fault", "list"); !strings.Contains(strings.Join(strings.Fields(out), " "), node+" "+dev+" xid") {
			t.Errorf("fault list does not show %s/%s:\n%s", node, dev, out)
		}
	})

	// watched is the pod whose device's recovery the clear step checks: victim, unless it leaves
	// first to free its GPU for the pinned claim.
	watched, watchedDev := "victim", dev
	if taintsKept {
		t.Run("new pod gets another GPU", func(t *testing.T) {
			applyPods(t, c, ns, framework.TemplatePod("second", "one-gpu"))
			c.WaitForPodPhase(t, ns, "second", 2*time.Minute, corev1.PodRunning)
			if _, got := podDevice(t, c, ns, "second"); got == dev {
				t.Errorf("pod second got the faulty %s", dev)
			}
		})
		t.Run("pinned claim waits, with the webhook's warning", func(t *testing.T) {
			_, warnings := c.KubectlWarnings(t, []byte(versioned(t, version, fmt.Sprintf(pinnedClaimYAML, strings.TrimPrefix(dev, "gpu-")))), "-n", ns, "apply", "-f", "-")
			if !strings.Contains(warnings, "can only be satisfied by tainted devices") || !strings.Contains(warnings, taintKey+"=xid:NoSchedule") {
				t.Errorf("no warning about tainted devices:\n%s", warnings)
			}
			applyPods(t, c, ns, framework.ClaimPod("pinned", "pinned"))
			waitForEvent(t, c, ns, "pinned", "FailedScheduling")
		})
		t.Run("NoExecute evicts the pod without toleration", func(t *testing.T) {
			applyPods(t, c, ns, framework.TemplatePod("tolerant", "one-gpu-tolerant")+"---\n"+framework.TemplatePod("intolerant", "one-gpu"))
			c.WaitForPodPhase(t, ns, "tolerant", 2*time.Minute, corev1.PodRunning)
			c.WaitForPodPhase(t, ns, "intolerant", 2*time.Minute, corev1.PodRunning)
			for _, pod := range []string{"tolerant", "intolerant"} {
				n, d := podDevice(t, c, ns, pod)
				faulted = append(faulted, n+"/"+d)
				kubectlDra(t, c, "fault", "set", n+"/"+d, "--kind", "fallen-off")
			}
			waitPodGone(t, c, ns, "intolerant", time.Minute)
			time.Sleep(5 * time.Second)
			c.WaitForPodPhase(t, ns, "tolerant", time.Second, corev1.PodRunning)
			_, watchedDev = podDevice(t, c, ns, "tolerant")
			watched = "tolerant"
		})
		t.Run("victim leaves, the pinned claim still waits for the taint", func(t *testing.T) {
			c.Kubectl(t, "-n", ns, "delete", "pod", "victim", "--wait=true")
			time.Sleep(5 * time.Second)
			if p := c.WaitForPodPhase(t, ns, "pinned", time.Second, corev1.PodPending); p.Spec.NodeName != "" {
				t.Errorf("pinned was scheduled onto the tainted %s", dev)
			}
		})
	}

	t.Run("clear", func(t *testing.T) {
		for _, ref := range faulted {
			kubectlDra(t, c, "fault", "clear", ref)
		}
		framework.Eventually(t, healthDeadline, "no taints left", func() (bool, error) {
			for i := range 8 {
				if deviceTaint(t, c, fmt.Sprintf("gpu-%d", i)) != "" {
					return false, nil
				}
			}
			return true, nil
		})
		if taintsKept {
			c.WaitForPodPhase(t, ns, "pinned", 2*time.Minute, corev1.PodRunning)
			if _, got := podDevice(t, c, ns, "pinned"); got != dev {
				t.Errorf("pinned got %s, want %s", got, dev)
			}
		}
		if statusServed {
			if err := waitHealthStatus(t, c, ns, watched, watchedDev, "Healthy", healthDeadline); err != nil {
				t.Error(err)
			}
		}
		waitForEvent(t, c, ns, watched, "DeviceRecovered")
		if left := faultsConfigMaps(t, c); len(left) != 0 {
			t.Errorf("faults ConfigMaps left after every fault was cleared: %v", left)
		}
	})

	t.Run("plugin log", func(t *testing.T) {
		logs, _ := c.KubectlErr("-n", releaseNS, "logs", "-l", pluginSelector, "--tail=-1")
		want := map[bool]int{true: 0, false: 1}[taintsKept]
		if n := strings.Count(logs, taintsDroppedLine); n != want {
			t.Errorf("the plugin logged %q %d times, want %d", taintsDroppedLine, n, want)
		}
		if !taintsKept && !strings.Contains(logs, `reason="API server drops devices[].taints (DRADeviceTaints off, or older than 1.33)"`) {
			t.Errorf("the fallback line does not say why:\n%s", logs)
		}
	})

	// Left set for the uninstall (checkNoFaultsLeft).
	kubectlDra(t, c, "fault", "set", node+"/"+dev, "--kind", "xid", "--message", "left at uninstall")
}

// faultsConfigMap is the chart's faults ConfigMap of the release; each node's are
// faults.ObjectName(faultsConfigMap, node).
const faultsConfigMap = release + "-faults"

// faultsConfigMaps lists the nodes' faults ConfigMaps of the release.
func faultsConfigMaps(t *testing.T, c *framework.Cluster) []string {
	t.Helper()
	list, err := c.Clientset.CoreV1().ConfigMaps(releaseNS).List(context.Background(), metav1.ListOptions{LabelSelector: faults.Selector(faultsConfigMap)})
	if err != nil {
		t.Fatalf("list the faults ConfigMaps: %v", err)
	}
	var names []string
	for _, cm := range list.Items {
		names = append(names, cm.Name)
	}
	return names
}

// checkNoFaultsLeft, after an uninstall, finds no faults ConfigMap: the chart's pre-delete hook
// deleted the nodes' (with the chart's, which owns them, the garbage collector would too).
func checkNoFaultsLeft(t *testing.T, c *framework.Cluster) {
	t.Helper()
	framework.Eventually(t, 30*time.Second, "no faults ConfigMap after uninstall", func() (bool, error) {
		return len(faultsConfigMaps(t, c)) == 0, nil
	})
}

const templatesYAML = `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: one-gpu
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.example.com
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: one-gpu-tolerant
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.example.com
          tolerations:
          # The eviction controller honours only tolerations naming the NoExecute effect.
          - key: gpu.example.com/unhealthy
            operator: Exists
            effect: NoExecute
`

// pinnedClaimYAML asks for one named GPU of the node.
const pinnedClaimYAML = `apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: pinned
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.example.com
        selectors:
        - cel:
            expression: device.attributes["gpu.example.com"].index == %s
`

// versioned is a v1 manifest as the cluster serves it (kubectl dra upgrade's conversion).
func versioned(t *testing.T, version, v1 string) string {
	t.Helper()
	if version == "v1" {
		return v1
	}
	out, _, err := manifest.Rewrite([]byte(v1), version)
	if err != nil {
		t.Fatalf("convert to %s: %v", version, err)
	}
	return string(out)
}

func applyPods(t *testing.T, c *framework.Cluster, ns, pods string) {
	t.Helper()
	if out, err := c.KubectlStdin([]byte(pods), "-n", ns, "apply", "-f", "-"); err != nil {
		t.Fatalf("apply pods: %v\n%s", err, out)
	}
}

func applyVersioned(t *testing.T, c *framework.Cluster, ns, version, v1 string) {
	t.Helper()
	if out, err := c.KubectlStdin([]byte(versioned(t, version, v1)), append([]string{"-n", ns, "apply", "-f", "-"}, olderFieldsDropped(version)...)...); err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
}

// olderFieldsDropped: an API server that serves resource.k8s.io only up to v1beta1 (1.32) does not
// know fields of later releases (tolerations, capacity requests) and refuses them under kubectl's
// strict field validation; without it, it drops them, as 1.34 with the feature gate off does, and
// the tests see the same fallback.
func olderFieldsDropped(version string) []string {
	if version == "v1beta1" {
		return []string{"--validate=false"}
	}
	return nil
}

// podDevice is the node and device of the pod's one-device claim.
func podDevice(t *testing.T, c *framework.Cluster, ns, pod string) (string, string) {
	t.Helper()
	p, err := c.Clientset.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil || len(p.Spec.ResourceClaims) == 0 {
		t.Fatalf("pod %s: %v", pod, err)
	}
	name := ptr.Deref(p.Spec.ResourceClaims[0].ResourceClaimName, "")
	if len(p.Status.ResourceClaimStatuses) > 0 {
		name = ptr.Deref(p.Status.ResourceClaimStatuses[0].ResourceClaimName, name)
	}
	claim, err := draclient.New(c.Clientset).ResourceClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil || claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s of pod %s: %+v, %v", name, pod, claim, err)
	}
	r := claim.Status.Allocation.Devices.Results[0]
	return p.Spec.NodeName, r.Device
}

// deviceTaint is the driver's taint on the device ("key=value:Effect"), "" for none.
func deviceTaint(t *testing.T, c *framework.Cluster, dev string) string {
	t.Helper()
	list, err := draclient.New(c.Clientset).ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.driver=" + driver})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			if d.Name != dev {
				continue
			}
			for _, taint := range d.Taints {
				if taint.Key == taintKey {
					return taint.Key + "=" + taint.Value + ":" + string(taint.Effect)
				}
			}
		}
	}
	return ""
}

// waitHealthStatus waits until the pod's container status reports the device with the health.
func waitHealthStatus(t *testing.T, c *framework.Cluster, ns, pod, dev, health string, timeout time.Duration) error {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last []corev1.ResourceStatus
	for time.Now().Before(deadline) {
		p, err := c.Clientset.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
		if err == nil && len(p.Status.ContainerStatuses) > 0 {
			last = p.Status.ContainerStatuses[0].AllocatedResourcesStatus
			for _, rs := range last {
				for _, r := range rs.Resources {
					// The CDI device ID (<vendor>/<class>=<claim UID>-<device>), else driver/pool/device.
					if id := string(r.ResourceID); strings.HasSuffix(id, "-"+dev) || strings.HasSuffix(id, "/"+dev) {
						if string(r.Health) == health {
							return nil
						}
					}
				}
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("pod %s/%s: allocatedResourcesStatus %+v, want %s %s within %s", ns, pod, last, dev, health, timeout)
}

func waitPodGone(t *testing.T, c *framework.Cluster, ns, pod string, timeout time.Duration) {
	t.Helper()
	framework.Eventually(t, timeout, "pod "+pod+" evicted", func() (bool, error) {
		p, err := c.Clientset.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && p.DeletionTimestamp != nil, nil
	})
}

// pluginMetrics scrapes the plugin's /metrics through the API server's pod proxy.
func pluginMetrics(t *testing.T, c *framework.Cluster) string {
	t.Helper()
	pods, err := c.Clientset.CoreV1().Pods(releaseNS).List(context.Background(), metav1.ListOptions{LabelSelector: pluginSelector})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("plugin pods: %v", err)
	}
	out, err := c.KubectlErr("get", "--raw", fmt.Sprintf("/api/v1/namespaces/%s/pods/%s:8080/proxy/metrics", releaseNS, pods.Items[0].Name))
	if err != nil {
		t.Logf("metrics: %v", err)
	}
	return out
}

// deviceTaintsKept: a dry-run create of a slice with a tainted device keeps the taint (KEP-5055
// on in the API server).
func deviceTaintsKept(t *testing.T, c *framework.Cluster) bool {
	t.Helper()
	got := dryRunProbeSlice(t, c, "a tainted device", resourceapi.ResourceSliceSpec{
		Devices: []resourceapi.Device{{Name: "d", Taints: []resourceapi.DeviceTaint{{Key: "example.com/t", Effect: resourceapi.DeviceTaintEffectNoSchedule}}}},
	})
	return len(got.Spec.Devices[0].Taints) == 1
}

// TestDeviceTaintDemos runs the reference driver's device-taint demos (testdata/upstream/
// device-taints, image swapped) against our driver, one after the other as their READMEs do:
// NoSchedule keeps the running pod and leaves a new one Pending, NoExecute evicts the running pod
// and a new one never runs (see neverRuns), a toleration keeps its pod, and tolerationSeconds: 300
// evicts its pod after five minutes while the unlimited toleration stays. Their DeviceTaintRules
// are resource.k8s.io/v1beta2, which 1.37 serves only with runtime-config; where the cluster
// serves the rules in another version the rule is applied in it (the spec is the same). Where it
// serves no DeviceTaintRule (before 1.37 without DRADeviceTaintRules) the API server refuses the
// rule, and that is what the test checks.
func TestDeviceTaintDemos(t *testing.T) {
	c := framework.Setup(t)
	version := c.NewestResourceVersion(t)
	installSharing(t, c, version)
	ruleVersion := taintRuleVersion(t, c)
	t.Logf("resource.k8s.io/%s; DeviceTaintRules served as: %q", version, ruleVersion)
	dir := filepath.Join("testdata", "upstream", "device-taints")
	apply := func(t *testing.T, demo, file string) {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(dir, demo, file))
		if err != nil {
			t.Fatal(err)
		}
		doc := versioned(t, version, string(data))
		if ruleVersion != "" && ruleVersion != "v1beta2" {
			doc = strings.ReplaceAll(doc, "apiVersion: resource.k8s.io/v1beta2\nkind: DeviceTaintRule", "apiVersion: resource.k8s.io/"+ruleVersion+"\nkind: DeviceTaintRule")
		}
		c.ApplyManifest(t, []byte(doc))
	}
	if ruleVersion == "" {
		data, err := os.ReadFile(filepath.Join(dir, "device-taint-pod-noschedule", "3-device-taint-rule.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		out, err := c.KubectlStdin(data, "apply", "-f", "-")
		if err == nil || !strings.Contains(err.Error(), "no matches for kind \"DeviceTaintRule\"") {
			t.Errorf("a cluster without DeviceTaintRules took the demo's rule: %v\n%s", err, out)
		}
		return
	}
	const ns = "basic-resourceclaimtemplate"
	reset := func(t *testing.T) {
		t.Helper()
		if t.Failed() {
			out, _ := c.KubectlErr("-n", ns, "get", "pods,resourceclaims,events", "-o", "wide")
			t.Logf("namespace %s at failure:\n%s", ns, out)
		}
		_, _ = c.KubectlErr("delete", "devicetaintrule", "example", "--ignore-not-found")
		_, _ = c.KubectlErr("delete", "namespace", ns, "--ignore-not-found", "--wait=true", "--timeout=2m")
	}
	running := func(t *testing.T, pods ...string) {
		t.Helper()
		for _, p := range pods {
			c.WaitForPodPhase(t, ns, p, 2*time.Minute, corev1.PodRunning)
		}
	}

	t.Run("device-taint-pod-noschedule", func(t *testing.T) {
		defer reset(t)
		const demo = "device-taint-pod-noschedule"
		apply(t, demo, "1-basic-resourceclaimtemplate.yaml")
		apply(t, demo, "2-pod-keeps-running.yaml")
		running(t, "pod-keeps-running")
		apply(t, demo, "3-device-taint-rule.yaml")
		apply(t, demo, "4-pod-not-scheduled.yaml")
		waitForEvent(t, c, ns, "pod-no-schedule", "FailedScheduling")
		time.Sleep(5 * time.Second)
		running(t, "pod-keeps-running")
		if p := c.WaitForPodPhase(t, ns, "pod-no-schedule", time.Second, corev1.PodPending); p.Spec.NodeName != "" {
			t.Errorf("pod-no-schedule was scheduled to %s", p.Spec.NodeName)
		}
	})
	t.Run("device-taint-pod-noexecute", func(t *testing.T) {
		defer reset(t)
		const demo = "device-taint-pod-noexecute"
		apply(t, demo, "1-basic-resourceclaimtemplate.yaml")
		apply(t, demo, "2-pod-to-be-evicted.yaml")
		running(t, "pod-to-be-evicted")
		apply(t, demo, "3-device-taint-rule.yaml")
		waitPodGone(t, c, ns, "pod-to-be-evicted", time.Minute)
		apply(t, demo, "4-pod-no-execute.yaml")
		neverRuns(t, c, ns, "pod-no-execute")
	})
	t.Run("device-taint-pod-toleration", func(t *testing.T) {
		defer reset(t)
		const demo = "device-taint-pod-toleration"
		apply(t, demo, "1-device-taint-rule.yaml")
		apply(t, demo, "2-basic-resourceclaimtemplate.yaml")
		running(t, "pod-with-toleration")
		neverRuns(t, c, ns, "pod-without-toleration")
	})
	t.Run("device-taint-configurable-pod-eviction-time", func(t *testing.T) {
		defer reset(t)
		const demo = "device-taint-configurable-pod-eviction-time"
		apply(t, demo, "1-basic-resourceclaimtemplate.yaml")
		running(t, "pod-no-toleration", "pod-with-toleration", "pod-with-300s-toleration")
		apply(t, demo, "2-device-taint-rule.yaml")
		tainted := time.Now()
		waitPodGone(t, c, ns, "pod-no-toleration", time.Minute)
		running(t, "pod-with-toleration", "pod-with-300s-toleration")
		// tolerationSeconds counts from the taint's timeAdded.
		time.Sleep(time.Until(tainted.Add(280 * time.Second)))
		running(t, "pod-with-300s-toleration")
		waitPodGone(t, c, ns, "pod-with-300s-toleration", time.Until(tainted.Add(360*time.Second)))
		t.Logf("pod-with-300s-toleration evicted %s after the rule", time.Since(tainted).Round(time.Second))
		running(t, "pod-with-toleration")
	})
}

// neverRuns: a pod created while every device has a NoExecute taint it does not tolerate does not
// run. The demos' READMEs say it is scheduled and evicted; Kubernetes 1.37's allocator keeps
// NoExecute-tainted devices from new claims as it does NoSchedule-tainted ones, so it stays
// Pending instead, whichever driver publishes the devices. Either is accepted.
func neverRuns(t *testing.T, c *framework.Cluster, ns, pod string) {
	t.Helper()
	framework.Eventually(t, time.Minute, "pod "+pod+" unschedulable or evicted", func() (bool, error) {
		p, err := c.Clientset.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			return false, fmt.Errorf("pod %s runs", pod)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return p.DeletionTimestamp != nil, nil
	})
}

// taintRuleVersion is the resource.k8s.io version serving DeviceTaintRules, the demos' v1beta2
// first; "" when none does.
func taintRuleVersion(t *testing.T, c *framework.Cluster) string {
	t.Helper()
	for _, v := range []string{"v1beta2", "v1", "v1alpha3"} {
		list, err := c.Clientset.Discovery().ServerResourcesForGroupVersion("resource.k8s.io/" + v)
		if err != nil {
			continue
		}
		for _, r := range list.APIResources {
			if r.Name == "devicetaintrules" {
				return v
			}
		}
	}
	return ""
}
