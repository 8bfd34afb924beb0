package e2e

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"sort"
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
	"github.com/gpu-dra/gpu-dra/internal/manifest"
)

const sharingFallbackLine = "Node group sharing falls back to exclusive"

// TestSharedMemory installs the chart with a shared-memory node group and runs the reference
// driver's gpu-allow-multiple-allocations demo (image swapped). Where the API server keeps
// consumable capacity (1.36+), the node's GPUs are published with allowMultipleAllocations and
// request policies on memory and compute, both claims get shares of one GPU with distinct share
// IDs and the capacity they asked for, and each container sees its share's size. Elsewhere the
// same values install, the plugin says once why it publishes exclusive GPUs, and the demo's claims
// (their capacity requests dropped by the API server) get a whole GPU each.
func TestSharedMemory(t *testing.T) {
	c := framework.Setup(t)
	version := c.NewestResourceVersion(t)
	installSharing(t, c, version, "inventory.nodeGroups[0].name=shared", "inventory.nodeGroups[0].sharing.mode=shared-memory")

	kept := consumableCapacityKept(t, c)
	t.Logf("resource.k8s.io/%s; the API server keeps consumable capacity: %v", version, kept)
	slices := draclient.New(c.Clientset).ResourceSlices()
	var devices []resourceapi.Device
	framework.Eventually(t, 2*time.Minute, "8 published GPUs", func() (bool, error) {
		list, err := slices.List(context.Background(), metav1.ListOptions{FieldSelector: "spec.driver=" + driver})
		if err != nil {
			return false, err
		}
		devices = nil
		for _, s := range list.Items {
			devices = append(devices, s.Spec.Devices...)
		}
		return len(devices) == 8, nil
	})

	t.Run("slices", func(t *testing.T) {
		for _, d := range devices {
			shared := ptr.Deref(d.AllowMultipleAllocations, false)
			if shared != kept {
				t.Errorf("%s: allowMultipleAllocations %v, want %v", d.Name, d.AllowMultipleAllocations, kept)
			}
			for _, name := range []resourceapi.QualifiedName{"memory", "compute"} {
				cp, ok := d.Capacity[name]
				hasPolicy := ok && cp.RequestPolicy != nil && cp.RequestPolicy.ValidRange != nil &&
					cp.RequestPolicy.ValidRange.Min != nil && cp.RequestPolicy.ValidRange.Step != nil && cp.RequestPolicy.ValidRange.Max != nil
				if hasPolicy != kept {
					t.Errorf("%s: capacity %s %+v; want a requestPolicy with min, step and max: %v", d.Name, name, cp, kept)
				}
			}
		}
	})

	ns := "gpu-allow-multiple-allocations"
	applyUpstream(t, c, "gpu-allow-multiple-allocations", version, ns)
	t.Run("gpu-allow-multiple-allocations", func(t *testing.T) {
		envs := map[string]map[string]string{}
		for _, pod := range []string{"pod0", "pod1"} {
			c.WaitForPodPhase(t, ns, pod, 2*time.Minute, corev1.PodRunning)
			envs[pod] = gpuVariables(c.Kubectl(t, "-n", ns, "exec", pod, "--", "env"))
		}
		claims, err := draclient.New(c.Clientset).ResourceClaims(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil || len(claims.Items) != 2 {
			t.Fatalf("claims %v, %v", claims, err)
		}
		var results []resourceapi.DeviceRequestAllocationResult
		for _, claim := range claims.Items {
			if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
				t.Fatalf("claim %s: allocation %+v", claim.Name, claim.Status.Allocation)
			}
			r := claim.Status.Allocation.Devices.Results[0]
			results = append(results, r)
			consumed := make([]string, 0, len(r.ConsumedCapacity))
			for name, q := range r.ConsumedCapacity {
				consumed = append(consumed, string(name)+"="+q.String())
			}
			sort.Strings(consumed)
			t.Logf("claim %s: device %s shareID %q consumedCapacity %v", claim.Name, r.Device, ptr.Deref(r.ShareID, ""), consumed)
			if kept {
				// The status the plugin records names the share.
				framework.Eventually(t, 30*time.Second, "status.devices of "+claim.Name, func() (bool, error) {
					cl, err := draclient.New(c.Clientset).ResourceClaims(ns).Get(context.Background(), claim.Name, metav1.GetOptions{})
					if err != nil {
						return false, err
					}
					for _, s := range cl.Status.Devices {
						if s.Driver == driver && s.Device == r.Device && r.ShareID != nil && ptr.Deref(s.ShareID, "") == string(*r.ShareID) {
							return true, nil
						}
					}
					return false, nil
				})
			}
		}
		a, b := results[0], results[1]
		if !kept {
			if a.Device == b.Device || a.ShareID != nil || b.ShareID != nil {
				t.Errorf("without consumable capacity: %s/%v and %s/%v, want two whole GPUs", a.Device, a.ShareID, b.Device, b.ShareID)
			}
			for pod, env := range envs {
				for k := range env {
					if strings.HasSuffix(k, "_MEMORY") || strings.HasSuffix(k, "_COMPUTE") {
						t.Errorf("%s sees %s without a share", pod, k)
					}
				}
			}
			return
		}
		if a.Device != b.Device || a.ShareID == nil || b.ShareID == nil || *a.ShareID == *b.ShareID {
			t.Errorf("want two shares of one GPU: %s share %v, %s share %v", a.Device, a.ShareID, b.Device, b.ShareID)
		}
		for _, r := range results {
			for name, want := range map[resourceapi.QualifiedName]string{"memory": "16Gi", "compute": "20"} {
				if got, ok := r.ConsumedCapacity[name]; !ok || got.Cmp(resource.MustParse(want)) != 0 {
					t.Errorf("share %v consumes %s %v, want %s", r.ShareID, name, r.ConsumedCapacity[name], want)
				}
			}
		}
		id := "GPU_DEVICE_" + strings.TrimPrefix(a.Device, "gpu-")
		for pod, env := range envs {
			if env[id] != a.Device || env[id+"_MEMORY"] != "16Gi" || env[id+"_COMPUTE"] != "20" {
				t.Errorf("%s sees %v, want %s=%s, %s_MEMORY=16Gi, %s_COMPUTE=20", pod, env, id, a.Device, id, id)
			}
		}
	})

	t.Run("webhook", func(t *testing.T) { sharingThroughWebhook(t, c, version, ns, kept) })

	t.Run("plugin log", func(t *testing.T) {
		checkFallbackLine(t, c, kept, sharingFallbackLine, `group="shared" want="shared-memory" reason="API server drops allowMultipleAllocations (DRAConsumableCapacity off)"`)
	})
}

// sharingThroughWebhook applies testdata/sharing-webhook.yaml beside the upstream demo's shares
// (issue 17): where the cluster shares GPUs, the 30Gi claim is admitted quietly and its pod gets a
// share of a GPU another claim shares too, the 200Gi claim is warned about with the capacity
// named, and the pod asking with annotations for 10Gi gets a 10Gi share (its container sees
// _MEMORY). Elsewhere the API server drops the capacity requests: whole GPUs, no warning.
func sharingThroughWebhook(t *testing.T, c *framework.Cluster, version, ns string, kept bool) {
	data, err := os.ReadFile(filepath.Join("testdata", "sharing-webhook.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if version != "v1" {
		if data, _, err = manifest.Rewrite(data, version); err != nil {
			t.Fatalf("convert to %s: %v", version, err)
		}
	}
	docs := strings.Split(string(data), "\n---\n")
	oversize := docs[len(docs)-1]
	_, warnings := c.KubectlWarnings(t, []byte(strings.Join(docs[:len(docs)-1], "\n---\n")), append([]string{"-n", ns, "apply", "-f", "-"}, olderFieldsDropped(version)...)...)
	t.Logf("apply: warnings %q", warnings)
	if strings.Contains(warnings, "share-30") || strings.Contains(warnings, "nothing currently published") || strings.Contains(warnings, "held now") {
		t.Errorf("the 30Gi share and the annotated pod were warned about: %s", warnings)
	}
	_, warnings = c.KubectlWarnings(t, []byte(oversize), append([]string{"-n", ns, "apply", "--dry-run=server", "-f", "-"}, olderFieldsDropped(version)...)...)
	want := "nothing currently published can satisfy the claim: request gpu: 8 published devices match its class and selectors, but none can hold its capacity requests: memory 200Gi requested, at most 80Gi on a device"
	t.Logf("200Gi claim: warnings %q", warnings)
	if strings.Contains(warnings, want) != kept {
		t.Errorf("200Gi claim: warnings %q; want %q: %v", warnings, want, kept)
	}

	dra := draclient.New(c.Clientset).ResourceClaims(ns)
	results := map[string]resourceapi.DeviceRequestAllocationResult{}
	framework.Eventually(t, 2*time.Minute, "every claim in "+ns+" allocated", func() (bool, error) {
		list, err := dra.List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, cl := range list.Items {
			if cl.Status.Allocation == nil || len(cl.Status.Allocation.Devices.Results) != 1 {
				return false, nil
			}
			owner := cl.Name
			if a := cl.Annotations["resource.kubernetes.io/pod-claim-name"]; a != "" && len(cl.OwnerReferences) == 1 {
				owner = cl.OwnerReferences[0].Name
			}
			results[owner] = cl.Status.Allocation.Devices.Results[0]
		}
		return len(list.Items) == 4, nil
	})
	onDevice := map[string]int{}
	for name, r := range results {
		onDevice[r.Device]++
		consumed := make([]string, 0, len(r.ConsumedCapacity))
		for n, q := range r.ConsumedCapacity {
			consumed = append(consumed, string(n)+"="+q.String())
		}
		sort.Strings(consumed)
		t.Logf("%s: %s request %s share %q consumed %v", name, r.Device, r.Request, ptr.Deref(r.ShareID, ""), consumed)
	}
	for name, memory := range map[string]string{"share-30": "30Gi", "annotated-share": "10Gi"} {
		c.WaitForPodPhase(t, ns, name, 2*time.Minute, corev1.PodRunning)
		r, ok := results[name]
		if !ok {
			t.Fatalf("no allocated claim of %s: %v", name, results)
		}
		env := gpuVariables(c.Kubectl(t, "-n", ns, "exec", name, "--", "env"))
		id := "GPU_DEVICE_" + strings.TrimPrefix(r.Device, "gpu-")
		if !kept {
			if r.ShareID != nil || env[id+"_MEMORY"] != "" {
				t.Errorf("%s without consumable capacity: %+v, env %v; want a whole GPU", name, r, env)
			}
			continue
		}
		if r.ShareID == nil || !r.ConsumedCapacity["memory"].Equal(resource.MustParse(memory)) || env[id+"_MEMORY"] != memory {
			t.Errorf("%s: %+v, env %v; want a share of %s", name, r, env, memory)
		}
		if onDevice[r.Device] < 2 {
			t.Errorf("%s has %s to itself; want it shared with the demo's claims (the allocator fills GPUs in order)", name, r.Device)
		}
	}
	if kept && results["annotated-share"].Request != "gpus/share" {
		t.Errorf("annotated pod's claim allocated %q, want the share alternative gpus/share", results["annotated-share"].Request)
	}
}

// installSharing installs the chart with the given --set values for the test (installForTest).
func installSharing(t *testing.T, c *framework.Cluster, version string, sets ...string) {
	t.Helper()
	args := make([]string, 0, 2*len(sets))
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	installForTest(t, c, version, args...)
}

// checkFallbackLine: the plugin logged the sharing fallback line exactly once, as want, where the
// API server does not keep the mode's fields, and never where it does.
func checkFallbackLine(t *testing.T, c *framework.Cluster, kept bool, line, want string) {
	t.Helper()
	count := func() int {
		logs, _ := c.KubectlErr("-n", releaseNS, "logs", "-l", pluginSelector, "--tail=-1")
		return strings.Count(logs, line)
	}
	wantLines := 0
	if !kept {
		wantLines = 1
		framework.Eventually(t, 30*time.Second, "the plugin's fallback line", func() (bool, error) { return count() > 0, nil })
		logs, _ := c.KubectlErr("-n", releaseNS, "logs", "-l", pluginSelector, "--tail=-1")
		if !strings.Contains(logs, want) {
			t.Errorf("fallback line without group, want and reason:\n%s", logs)
		}
	}
	if n := count(); n != wantLines {
		t.Errorf("the plugin logged %q %d times, want %d", line, n, wantLines)
	}
}

// consumableCapacityKept: a dry-run create of a slice with a shared device keeps
// allowMultipleAllocations (KEP-5075 on in the API server).
func consumableCapacityKept(t *testing.T, c *framework.Cluster) bool {
	t.Helper()
	got := dryRunProbeSlice(t, c, "a shared device", resourceapi.ResourceSliceSpec{
		Devices: []resourceapi.Device{{Name: "d", AllowMultipleAllocations: ptr.To(true),
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("1Gi")}}}},
	})
	return ptr.Deref(got.Spec.Devices[0].AllowMultipleAllocations, false)
}

var gpuVariable = regexp.MustCompile(`^(GPU_DEVICE_[0-9A-Z_]+)=(.*)$`)

// gpuVariables are the GPU_DEVICE_* variables of env's output.
func gpuVariables(env string) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(env, "\n") {
		if m := gpuVariable.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			out[m[1]] = m[2]
		}
	}
	return out
}
