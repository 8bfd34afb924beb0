package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	draclient "k8s.io/dynamic-resource-allocation/client"

	"github.com/gpu-dra/gpu-dra/driver/attach"
	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// TestBindingConditions installs the chart with an attachable node group (every node) and runs the
// reference driver's binding-conditions demo (image swapped). Where the API server keeps binding
// conditions (1.36+, DRADeviceBindingConditions with DRAResourceClaimDeviceStatus), every published
// GPU carries bindingConditions [Attached] and bindingFailureConditions [AttachFailed]. With an
// attach-failure fault on every GPU, the demo's claim is allocated, its GPU's attach fails
// (AttachFailed=True in status.devices), the scheduler deallocates the claim and tries again, and
// the pod is never bound; once the faults are cleared, the next attempt attaches the GPU and the
// pod runs, its claim allocated,reserved with Attached=True, as the demo's README shows. Elsewhere
// the plugin says once that it publishes exclusive GPUs instead, no device carries binding
// conditions, and the demo's pod runs on a plain GPU.
func TestBindingConditions(t *testing.T) {
	c := framework.Setup(t)
	version := c.NewestResourceVersion(t)
	installSharing(t, c, version, "inventory.nodeGroups[0].name=attachable", "inventory.nodeGroups[0].sharing.mode=attachable",
		"inventory.nodeGroups[0].sharing.attachDelay=3s")
	kept := bindingConditionsKept(t, c)
	t.Logf("resource.k8s.io/%s; the API server keeps binding conditions: %v", version, kept)
	devices := publishedDevices(t, c)
	for ref, d := range devices {
		if got := fmt.Sprint(d.BindingConditions, d.BindingFailureConditions); kept && got != "[Attached] [AttachFailed]" || !kept && got != "[] []" {
			t.Errorf("%s publishes binding conditions %s", ref, got)
		}
	}

	ns := "binding-conditions"
	if !kept {
		checkFallbackLine(t, c, false, sharingFallbackLine,
			`group="attachable" want="attachable" reason="API server drops bindingConditions (DRADeviceBindingConditions or DRAResourceClaimDeviceStatus off)"`)
		t.Logf("this cluster lacks binding conditions (KEP-5007: beta and on by default from 1.36; on 1.34-1.35 the " +
			"DRADeviceBindingConditions gate, alpha, must be on in the API server and scheduler; 1.32-1.33 have no such field): " +
			"the demo runs as an ordinary claim, its pod bound without waiting for an attach")
		applyUpstream(t, c, "binding-conditions", version, ns)
		c.WaitForPodPhase(t, ns, "pod0", 2*time.Minute, corev1.PodRunning)
		return
	}
	checkFallbackLine(t, c, true, sharingFallbackLine, "")

	// Every GPU's attach fails: the demo's pod is allocated a GPU again and again, never bound.
	var faulted []string
	t.Cleanup(func() {
		for _, ref := range faulted {
			kubectlDra(t, c, "fault", "clear", ref)
		}
	})
	for ref := range devices {
		kubectlDra(t, c, "fault", "set", ref, "--kind", "attach-failure", "--message", "e2e: fabric link down")
		faulted = append(faulted, ref)
	}
	time.Sleep(5 * time.Second) // the plugins' fault informers
	applyUpstream(t, c, "binding-conditions", version, ns)
	claims := draclient.New(c.Clientset).ResourceClaims(ns)
	// claimOf is the claim the demo's template made for pod0 (nil before it exists).
	claimOf := func() (*resourceapi.ResourceClaim, error) {
		list, err := claims.List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		if len(list.Items) != 1 {
			return nil, fmt.Errorf("the demo's namespace holds %d claims, want 1", len(list.Items))
		}
		return &list.Items[0], nil
	}
	// Each allocation carries the time the scheduler made it. The scheduler allocates again within
	// milliseconds of deallocating, so a poll may never see the claim without one: two allocations
	// that each failed to attach show the first given up.
	failedAt := map[string]bool{}
	framework.Eventually(t, 3*time.Minute, "two allocations of the demo's claim failing to attach, the first given up by the scheduler", func() (bool, error) {
		claim, err := claimOf()
		if err != nil {
			return false, err
		}
		cond := attach.TrueCondition(claim, "AttachFailed")
		if cond == nil || claim.Status.Allocation == nil || claim.Status.Allocation.AllocationTimestamp == nil {
			return false, nil
		}
		at := claim.Status.Allocation.AllocationTimestamp.UTC().Format(time.RFC3339)
		if !failedAt[at] {
			failedAt[at] = true
			t.Logf("the allocation of %s failed to attach: %s", at, cond.Message)
		}
		return len(failedAt) >= 2, nil
	})
	if pod := c.WaitForPodPhase(t, ns, "pod0", time.Second, corev1.PodPending); pod.Spec.NodeName != "" {
		t.Fatalf("pod0 bound to %s although every attach failed", pod.Spec.NodeName)
	}

	// The faults are cleared: the next attempt attaches, and the pod runs.
	for _, ref := range faulted {
		kubectlDra(t, c, "fault", "clear", ref)
	}
	faulted = nil
	c.WaitForPodPhase(t, ns, "pod0", 3*time.Minute, corev1.PodRunning)
	claim, err := claimOf()
	if err != nil {
		t.Fatal(err)
	}
	cond := attach.TrueCondition(claim, "Attached")
	if claim.Status.Allocation == nil || len(claim.Status.ReservedFor) != 1 || cond == nil || cond.Reason != "Attached" {
		t.Errorf("the demo's claim: allocation %v, reservedFor %v, devices %+v; want allocated, reserved, Attached=True",
			claim.Status.Allocation, claim.Status.ReservedFor, claim.Status.Devices)
	}
	if r := claim.Status.Allocation.Devices.Results; len(r) != 1 || fmt.Sprint(r[0].BindingConditions) != "[Attached]" {
		t.Errorf("allocation results %+v, want one GPU with its binding conditions", r)
	}
	out := c.Kubectl(t, "-n", ns, "get", "resourceclaims")
	if !strings.Contains(out, "allocated,reserved") {
		t.Errorf("kubectl get resourceclaims:\n%s\nwant allocated,reserved", out)
	}
}

// bindingConditionsKept: a dry-run create of a slice with a device with binding conditions keeps
// them (KEP-5007 on in the API server).
func bindingConditionsKept(t *testing.T, c *framework.Cluster) bool {
	t.Helper()
	got := dryRunProbeSlice(t, c, "binding conditions", resourceapi.ResourceSliceSpec{
		Devices: []resourceapi.Device{{Name: "d", BindingConditions: []string{"Attached"}, BindingFailureConditions: []string{"AttachFailed"}}},
	})
	return len(got.Spec.Devices[0].BindingConditions) == 1
}

// publishedDevices are the driver's published devices by node/device, once every node published.
func publishedDevices(t *testing.T, c *framework.Cluster) map[string]resourceapi.Device {
	t.Helper()
	out := map[string]resourceapi.Device{}
	framework.Eventually(t, 2*time.Minute, "published GPUs", func() (bool, error) {
		list, err := draclient.New(c.Clientset).ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.driver=" + driver})
		if err != nil {
			return false, err
		}
		clear(out)
		for _, s := range list.Items {
			for _, d := range s.Spec.Devices {
				out[*s.Spec.NodeName+"/"+d.Name] = d
			}
		}
		return len(out) > 0, nil
	})
	return out
}
