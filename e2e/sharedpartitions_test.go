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
// (1.36+), the demo's two claims each get a share (8Gi, 10 compute) of the same partition, and both
// pods see that partition, as the demo's README shows. Where it keeps partitions only, the group
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
	devices := map[string]string{}
	var results []resourceapi.DeviceRequestAllocationResult
	for _, pod := range []string{"pod0", "pod1"} {
		c.WaitForPodPhase(t, ns, pod, 2*time.Minute, corev1.PodRunning)
		var logs string
		framework.Eventually(t, time.Minute, pod+"'s exported variables", func() (bool, error) {
			var err error
			logs, err = c.KubectlErr("-n", ns, "logs", pod, "-c", "ctr0")
			return strings.Contains(logs, "GPU_DEVICE_0"), err
		})
		devices[pod] = exportedEnv(logs)["GPU_DEVICE_0"]
		claim, err := draclient.New(c.Clientset).ResourceClaims(ns).Get(context.Background(), "shared-partition-"+pod, metav1.GetOptions{})
		if err != nil || claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
			t.Fatalf("claim of %s: %+v %v", pod, claim, err)
		}
		results = append(results, claim.Status.Allocation.Devices.Results[0])
	}
	t.Logf("pods see %v; claims got %s and %s", devices, results[0].Device, results[1].Device)
	for pod, dev := range devices {
		if dev == "" {
			t.Errorf("%s sees no GPU_DEVICE_0", pod)
		}
	}

	partition := regexp.MustCompile(`^gpu-[0-9]+-partition-[0-9]+$`)
	switch {
	case partitions && shares:
		// As the demo's README: both pods on the same partition, each with its own share.
		if devices["pod0"] != devices["pod1"] || !partition.MatchString(results[0].Device) || results[0].Device != results[1].Device {
			t.Errorf("want both claims on one partition: %s, %s (pods see %v)", results[0].Device, results[1].Device, devices)
		}
		for i, r := range results {
			mem, comp := r.ConsumedCapacity["memory"], r.ConsumedCapacity["compute"]
			if r.ShareID == nil || mem.String() != "8Gi" || comp.String() != "10" {
				t.Errorf("claim %d: share %v consumed %v, want a share of 8Gi and 10 compute", i, r.ShareID, r.ConsumedCapacity)
			}
		}
		if results[0].ShareID != nil && results[1].ShareID != nil && *results[0].ShareID == *results[1].ShareID {
			t.Errorf("both claims got share %s", *results[0].ShareID)
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
