package e2e

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	draclient "k8s.io/dynamic-resource-allocation/client"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// TestSharedPartitions installs the chart with a shared-partitions node group (2 GPUs of 4
// partitions) and runs the reference driver's gpu-allow-multiple-allocations-partitionable demo
// (image swapped). Where the API server keeps both partitionable devices and consumable capacity
// (1.36+), the demo's two claims each get a share (8Gi, 10 compute) of a partition, and each pod
// sees its partition (in this driver's variables for a partition, GPU_DEVICE_<gpu>_PARTITION_<n>,
// with the share's size); a claim pinned to the first claim's partition gets another share of it. Where it keeps partitions only, the group
// falls back to plain partitions (the claims lose their capacity requests and get a partition
// each); where it keeps neither, to whole GPUs, one per claim. The plugin says which once.
func TestSharedPartitions(t *testing.T) {
	c := framework.Setup(t)
	version := c.NewestResourceVersion(t)
	installSharing(t, c, version, "inventory.nodeGroups[0].name=shared-partitions", "inventory.nodeGroups[0].count=2",
		"inventory.nodeGroups[0].sharing.mode=shared-partitions", "inventory.nodeGroups[0].sharing.partitions=4")
	partitions, shares := partitionableKept(t, c), consumableCapacityKept(t, c)
	t.Logf("resource.k8s.io/%s; the API server keeps partitionable devices: %v, consumable capacity: %v", version, partitions, shares)

	ns := "gpu-allow-multiple-allocations-partitionable"
	applyUpstream(t, c, ns, version, ns)
	envs := map[string]map[string]string{}
	var results []resourceapi.DeviceRequestAllocationResult
	for _, pod := range []string{"pod0", "pod1"} {
		c.WaitForPodPhase(t, ns, pod, 2*time.Minute, corev1.PodRunning)
		var logs string
		framework.Eventually(t, time.Minute, pod+"'s exported variables", func() (bool, error) {
			var err error
			logs, err = c.KubectlErr("-n", ns, "logs", pod, "-c", "ctr0")
			return strings.Contains(logs, "GPU_DEVICE_"), err
		})
		envs[pod] = exportedEnv(logs)
		claim, err := draclient.New(c.Clientset).ResourceClaims(ns).Get(context.Background(), "shared-partition-"+pod, metav1.GetOptions{})
		if err != nil || claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
			t.Fatalf("claim of %s: %+v %v", pod, claim, err)
		}
		results = append(results, claim.Status.Allocation.Devices.Results[0])
	}
	t.Logf("claims got %s and %s", results[0].Device, results[1].Device)

	partition := regexp.MustCompile(`^gpu-[0-9]+-partition-[0-9]+$`)
	switch {
	case partitions && shares:
		// Each claim gets a share of a partition, its size in the partition's variables (named as
		// for any partition). The demo's README shows both on one partition; the scheduler may as
		// well pick two (it did on 1.37.2), and then a third claim pinned to the first one's
		// partition shows that one partition holds several shares.
		for i, r := range results {
			mem, comp := r.ConsumedCapacity["memory"], r.ConsumedCapacity["compute"]
			if !partition.MatchString(r.Device) || r.ShareID == nil || mem.String() != "8Gi" || comp.String() != "10" {
				t.Errorf("claim %d: %s share %v consumed %v, want a share of 8Gi and 10 compute of a partition", i, r.Device, r.ShareID, r.ConsumedCapacity)
			}
		}
		for i, pod := range []string{"pod0", "pod1"} {
			m := partitionName.FindStringSubmatch(results[i].Device)
			if m == nil {
				continue
			}
			id := "GPU_DEVICE_" + m[1] + "_PARTITION_" + m[2]
			if env := envs[pod]; env[id] != results[i].Device || env[id+"_MEMORY"] != "8Gi" || env[id+"_COMPUTE"] != "10" {
				t.Errorf("%s sees %v; want %s=%s, %s_MEMORY=8Gi, %s_COMPUTE=10", pod, env, id, results[i].Device, id, id)
			}
		}
		switch m := partitionName.FindStringSubmatch(results[0].Device); {
		case results[0].Device == results[1].Device:
			if results[0].ShareID != nil && results[1].ShareID != nil && *results[0].ShareID == *results[1].ShareID {
				t.Errorf("both claims got share %s", *results[0].ShareID)
			}
		case m != nil:
			third := pinnedShare(t, c, ns, m[1], m[2])
			if third.Device != results[0].Device || third.ShareID == nil || results[0].ShareID == nil || *third.ShareID == *results[0].ShareID {
				t.Errorf("a claim pinned to %s got %s share %v; want another share of it", results[0].Device, third.Device, third.ShareID)
			}
		}
	case partitions:
		checkFallbackLine(t, c, false, "Node group sharing falls back to partitioned", `group="shared-partitions" want="shared-partitions" reason="API server drops allowMultipleAllocations (DRAConsumableCapacity off)"`)
		if results[0].Device == results[1].Device || !partition.MatchString(results[0].Device) || !partition.MatchString(results[1].Device) {
			t.Errorf("without consumable capacity want two partitions: %s, %s", results[0].Device, results[1].Device)
		}
	default:
		checkFallbackLine(t, c, false, sharingFallbackLine, `group="shared-partitions" want="shared-partitions" reason="API server drops sharedCounters (DRAPartitionableDevices off)"`)
		whole := regexp.MustCompile(`^gpu-[0-9]+$`)
		if results[0].Device == results[1].Device || !whole.MatchString(results[0].Device) || !whole.MatchString(results[1].Device) {
			t.Errorf("without partitionable devices want two whole GPUs: %s, %s", results[0].Device, results[1].Device)
		}
	}
}

// pinnedShare runs a pod whose claim asks for 8Gi and 10 compute of partition part of GPU gpu and
// returns its allocation.
func pinnedShare(t *testing.T, c *framework.Cluster, ns, gpu, part string) resourceapi.DeviceRequestAllocationResult {
	t.Helper()
	claim := `apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: pinned-share
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: ` + driver + `
        selectors:
        - cel:
            expression: device.attributes["` + driver + `"].index == ` + gpu + ` && device.attributes["` + driver + `"].partition == ` + part + `
        capacity:
          requests:
            memory: 8Gi
            compute: "10"
`
	applyPods(t, c, ns, claim+"---\n"+framework.ClaimPod("pinned", "pinned-share"))
	c.WaitForPodPhase(t, ns, "pinned", 2*time.Minute, corev1.PodRunning)
	got, err := draclient.New(c.Clientset).ResourceClaims(ns).Get(context.Background(), "pinned-share", metav1.GetOptions{})
	if err != nil || got.Status.Allocation == nil || len(got.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("pinned claim: %+v %v", got, err)
	}
	return got.Status.Allocation.Devices.Results[0]
}
