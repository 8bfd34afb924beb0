package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

var partitionName = regexp.MustCompile(`^gpu-([0-9]+)-partition-([0-9]+)$`)

// TestPartitionableDevices installs the chart with a partitioned node group (2 GPUs of 4
// partitions, as the demo's README asks of the reference driver) and runs the reference driver's
// partitionable-devices demo (image swapped). Where the API server keeps partitionable devices
// (1.36+), each GPU is a counter set in a slice of its own (1.35+'s layout) with its partitions
// and whole-GPU device in another, the demo's claim gets two partitions of one physical GPU, and
// a claim for that GPU's whole device stays Pending with the scheduler's reason until the
// partitions are released: the shared counters, not the devices, stand in its way. Elsewhere the
// same values install, the plugin says once why it publishes whole GPUs, and the demo gets two.
func TestPartitionableDevices(t *testing.T) {
	c := framework.Setup(t)
	version := c.NewestResourceVersion(t)
	installSharing(t, c, version, "inventory.nodeGroups[0].name=partitioned", "inventory.nodeGroups[0].count=2",
		"inventory.nodeGroups[0].sharing.mode=partitioned", "inventory.nodeGroups[0].sharing.partitions=4")

	kept := partitionableKept(t, c)
	t.Logf("resource.k8s.io/%s; the API server keeps partitionable devices: %v", version, kept)
	wantDevices := 2
	if kept {
		wantDevices = 2 * (4 + 1)
	}
	slices := draclient.New(c.Clientset).ResourceSlices()
	var published []resourceapi.ResourceSlice
	devices := map[string]resourceapi.Device{}
	framework.Eventually(t, 2*time.Minute, fmt.Sprintf("%d published devices", wantDevices), func() (bool, error) {
		list, err := slices.List(context.Background(), metav1.ListOptions{FieldSelector: "spec.driver=" + driver})
		if err != nil {
			return false, err
		}
		published, devices = list.Items, map[string]resourceapi.Device{}
		for _, s := range list.Items {
			for _, d := range s.Spec.Devices {
				devices[d.Name] = d
			}
		}
		return len(devices) == wantDevices, nil
	})

	t.Run("slices", func(t *testing.T) {
		sets := 0
		for _, s := range published {
			if len(s.Spec.SharedCounters) > 0 && len(s.Spec.Devices) > 0 {
				t.Errorf("slice %s holds counter sets and devices", s.Name)
			}
			for _, set := range s.Spec.SharedCounters {
				sets++
				if mem, comp := set.Counters["memory"].Value, set.Counters["compute"].Value; !mem.Equal(resource.MustParse("80Gi")) || !comp.Equal(resource.MustParse("100")) {
					t.Errorf("counter set %s: %+v", set.Name, set.Counters)
				}
			}
		}
		if want := map[bool]int{true: 2, false: 0}[kept]; sets != want {
			t.Errorf("%d counter sets published, want %d", sets, want)
		}
		for name, d := range devices {
			if kept != (len(d.ConsumesCounters) == 1) {
				t.Errorf("%s consumes %+v; partitioned published: %v", name, d.ConsumesCounters, kept)
			}
		}
	})

	ns := "partitionable-devices"
	applyUpstream(t, c, "partitionable-devices", version, ns)
	var results []resourceapi.DeviceRequestAllocationResult
	t.Run("partitionable-devices", func(t *testing.T) {
		c.WaitForPodPhase(t, ns, "pod0", 2*time.Minute, corev1.PodRunning)
		claims, err := draclient.New(c.Clientset).ResourceClaims(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil || len(claims.Items) != 1 || claims.Items[0].Status.Allocation == nil {
			t.Fatalf("claims %+v, %v", claims, err)
		}
		results = claims.Items[0].Status.Allocation.Devices.Results
		var names []string
		for _, r := range results {
			names = append(names, r.Device)
		}
		t.Logf("pod0's claim got %v", names)
		var logs string
		framework.Eventually(t, time.Minute, "pod0's exported variables", func() (bool, error) {
			var err error
			logs, err = c.KubectlErr("-n", ns, "logs", "pod0", "-c", "ctr0")
			return strings.Contains(logs, "GPU_DEVICE_"), err
		})
		env := exportedEnv(logs)
		if len(results) != 2 || results[0].Device == results[1].Device {
			t.Fatalf("want two devices: %v", names)
		}
		if !kept {
			for _, n := range names {
				if !regexp.MustCompile(`^gpu-[0-9]+$`).MatchString(n) {
					t.Errorf("without partitionable devices the claim got %s, want whole GPUs", n)
				}
			}
			return
		}
		var gpu string
		for _, r := range results {
			m := partitionName.FindStringSubmatch(r.Device)
			if m == nil || (gpu != "" && m[1] != gpu) {
				t.Fatalf("want two partitions of one GPU: %v", names)
			}
			gpu = m[1]
			id := fmt.Sprintf("GPU_DEVICE_%s_PARTITION_%s", m[1], m[2])
			if env[id] != r.Device || env[id+"_MEMORY"] != "20Gi" || env[id+"_COMPUTE"] != "25" {
				t.Errorf("pod0 sees %v; want %s=%s, %s_MEMORY=20Gi, %s_COMPUTE=25", env, id, r.Device, id, id)
			}
		}
	})

	if kept && len(results) == 2 {
		t.Run("whole GPU beside its partitions", func(t *testing.T) {
			// The GPU's whole device, by its uuid (which its partitions share) and its memory
			// (which they lack): the webhook checks selectors against the attributes every device
			// publishes, which "full" is not.
			gpu := partitionName.FindStringSubmatch(results[0].Device)[1]
			full := devices["gpu-"+gpu+"-full"]
			uuid := ptr.Deref(full.Attributes["uuid"].StringValue, "")
			if uuid == "" {
				t.Fatalf("gpu-%s-full not published with a uuid: %+v", gpu, full)
			}
			claim := fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: whole-gpu
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: %s
        selectors:
        - cel:
            expression: device.attributes["%s"].uuid == "%s" && device.capacity["%s"].memory.compareTo(quantity("80Gi")) >= 0
`, driver, driver, uuid, driver)
			if out, err := c.KubectlStdin([]byte(claim+"---\n"+framework.ClaimPod("whole", "whole-gpu")), "-n", ns, "apply", "-f", "-"); err != nil {
				t.Fatalf("create claim and pod: %v\n%s", err, out)
			}
			// The whole GPU's device is free, but its counters are not.
			var reason string
			framework.Eventually(t, time.Minute, "the scheduler's reason for pod whole", func() (bool, error) {
				pod, err := c.Clientset.CoreV1().Pods(ns).Get(context.Background(), "whole", metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				for _, cond := range pod.Status.Conditions {
					if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
						reason = cond.Message
						return true, nil
					}
				}
				return false, nil
			})
			t.Logf("pod whole is Pending: %s", reason)
			if !strings.Contains(reason, "cannot allocate all claims") {
				t.Errorf("pod whole is unschedulable for another reason: %s", reason)
			}
			time.Sleep(10 * time.Second)
			if pod := c.WaitForPodPhase(t, ns, "whole", time.Second, corev1.PodPending); pod.Spec.NodeName != "" {
				t.Errorf("pod whole was scheduled to %s beside the partitions", pod.Spec.NodeName)
			}

			// Once the partitions go, the same claim fits.
			c.Kubectl(t, "-n", ns, "delete", "pod", "pod0", "--wait=true")
			c.WaitForPodPhase(t, ns, "whole", 2*time.Minute, corev1.PodRunning)
			id := "GPU_DEVICE_" + gpu + "_FULL"
			env := gpuVariables(c.Kubectl(t, "-n", ns, "exec", "whole", "--", "env"))
			if env[id] != "gpu-"+gpu+"-full" || env[id+"_MEMORY"] != "80Gi" || env[id+"_COMPUTE"] != "100" {
				t.Errorf("pod whole sees %v, want %s=gpu-%s-full with 80Gi and 100", env, id, gpu)
			}
		})
	}

	t.Run("plugin log", func(t *testing.T) {
		checkFallbackLine(t, c, kept, sharingFallbackLine, `group="partitioned" want="partitioned" reason="API server drops sharedCounters (DRAPartitionableDevices off)"`)
	})
}

// partitionableKept: a dry-run create of a slice with a counter set keeps it (KEP-4815 on in
// the API server).
func partitionableKept(t *testing.T, c *framework.Cluster) bool {
	t.Helper()
	got := dryRunProbeSlice(t, c, "a counter set", resourceapi.ResourceSliceSpec{
		SharedCounters: []resourceapi.CounterSet{{Name: "c", Counters: map[string]resourceapi.Counter{"memory": {Value: resource.MustParse("1Gi")}}}},
	})
	return len(got.Spec.SharedCounters) == 1
}

// dryRunProbeSlice is what the API server would store of a slice with spec (driver, pool and
// node selection filled in), created with dryRun: what it drops, it does not serve.
func dryRunProbeSlice(t *testing.T, c *framework.Cluster, what string, spec resourceapi.ResourceSliceSpec) *resourceapi.ResourceSlice {
	t.Helper()
	spec.Driver, spec.AllNodes, spec.Pool = "probe.example.com", ptr.To(true), resourceapi.ResourcePool{Name: "probe", ResourceSliceCount: 1}
	slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-probe-"}, Spec: spec}
	got, err := draclient.New(c.Clientset).ResourceSlices().Create(context.Background(), slice, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatalf("dry-run create of a slice with %s: %v", what, err)
	}
	return got
}
