package multinode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

const groupLabel = "gpu.example.com/group"

// Three node groups, one per node: the first node keeps the defaults (exclusive GPUs).
const mixedFleetValues = `inventory:
  nodeGroups:
  - name: shared
    nodeSelector: {gpu.example.com/group: shared}
    sharing: {mode: shared-memory}
  - name: partitioned
    nodeSelector: {gpu.example.com/group: partitioned}
    sharing: {mode: partitioned, partitions: 2}
`

// TestMixedFleet is a fleet of three kinds of nodes: exclusive GPUs, shared-memory GPUs and
// partitioned GPUs, one node each, from one chart. Each node's plugin publishes its own group's
// devices. Pods annotated gpu.example.com/memory land where the README says: a share of a
// shared-memory GPU while one has room (two such pods share one GPU), and once that node has
// none and the partitioned node is cordoned, a whole GPU of the exclusive node. A claim for two devices of the class gets partitions of the
// partitioned node's GPU. Where the API server serves neither consumable capacity nor
// partitionable devices (before 1.36), every node publishes whole GPUs and the annotated pods get
// whole GPUs.
func TestMixedFleet(t *testing.T) {
	c, nodes := setup(t, 3)
	install(t, c, nodes)
	// nodes[0] keeps the defaults: exclusive GPUs.
	shared, partitioned := nodes[1], nodes[2]
	ns := c.Namespace(t, "fleet")
	share := map[string]string{"gpu.example.com/count": "1", "gpu.example.com/memory": "10Gi"}
	whole := injected(t, c, ns, annotatedPod("probe", share))
	served := fleet(t, c, nodes, shared, partitioned)
	if served {
		webhookSeesShares(t, c, ns, annotatedPod("probe", share), whole)
	}
	for _, name := range []string{"share-a", "share-b"} {
		apply(t, c, ns, annotatedPod(name, share))
	}
	var devices []string
	for _, name := range []string{"share-a", "share-b"} {
		pod, claim, memory := gpuPod(t, c, ns, name)
		devices = append(devices, claim.Devices[0])
		switch {
		case !served && memory != "":
			t.Errorf("%s got a share (%s) on a cluster that cannot share", name, memory)
		case served && (pod.Spec.NodeName != shared.Name || memory != "10Gi"):
			t.Errorf("%s: on %s with %v (memory %q), want a 10Gi share of a GPU of %s", name, pod.Spec.NodeName, claim.Devices, memory, shared.Name)
		}
	}
	if !served {
		return
	}
	if devices[0] != devices[1] {
		t.Errorf("the two shares are on %v, want one GPU", devices)
	}

	// No room left on the shared node (cordoned: no new pod goes there): an exclusive device with
	// the memory elsewhere. A partition with enough memory is one too, so the partitioned node is
	// cordoned as well, leaving the exclusive node's whole GPUs as the only fallback.
	c.Kubectl(t, "cordon", shared.Name, partitioned.Name)
	t.Cleanup(func() { c.Kubectl(t, "uncordon", shared.Name, partitioned.Name) })
	apply(t, c, ns, annotatedPod("whole", share))
	pod, claim, memory := gpuPod(t, c, ns, "whole")
	if pod.Spec.NodeName != nodes[0].Name || memory != "" || strings.Contains(claim.Devices[0], "partition") {
		t.Errorf("with %s full and %s cordoned: on %s with %v (memory %q), want a whole GPU of %s",
			shared.Name, partitioned.Name, pod.Spec.NodeName, claim.Devices, memory, nodes[0].Name)
	}
	c.Kubectl(t, "uncordon", shared.Name, partitioned.Name)
	partitions(t, c, partitioned)
}

// fleet labels the nodes into the groups of mixedFleetValues, upgrades the chart to them and waits
// for each node's slice to take its group's shape; it says whether the cluster serves sharing.
func fleet(t *testing.T, c *framework.Cluster, nodes []node, shared, partitioned node) bool {
	t.Helper()
	c.Kubectl(t, "label", "node", shared.Name, groupLabel+"=shared", "--overwrite")
	c.Kubectl(t, "label", "node", partitioned.Name, groupLabel+"=partitioned", "--overwrite")
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(mixedFleetValues), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Kubectl(t, "label", "node", shared.Name, partitioned.Name, groupLabel+"-")
		c.Helm(t, "upgrade", framework.Release, chartDir, "-n", releaseNS, "--reuse-values", "--wait", "--timeout", "5m",
			"--set", "inventory.nodeGroups=null")
	})
	c.Helm(t, "upgrade", framework.Release, chartDir, "-n", releaseNS, "--reuse-values", "--wait", "--timeout", "5m", "-f", values)
	served := servesSharing(t, c)
	t.Logf("the API server serves consumable capacity and partitionable devices: %v", served)
	want := map[string]string{nodes[0].Name: "exclusive", shared.Name: "exclusive", partitioned.Name: "exclusive"}
	if served {
		want[shared.Name], want[partitioned.Name] = "shared", "partitioned"
	}
	// The plugins re-read the groups file; each node republishes within a minute.
	framework.Eventually(t, 90*time.Second, "each node's slice in its group's shape", func() (bool, error) {
		for _, n := range nodes {
			devices, err := devicesOf(context.Background(), c, n.Name)
			if err != nil {
				return false, err
			}
			if got := shape(devices); got != want[n.Name] {
				return false, fmt.Errorf("node %s publishes %s GPUs, want %s", n.Name, got, want[n.Name])
			}
		}
		return true, nil
	})
	return served
}

// injected is the template the webhook gives the annotated pod of manifest (a server-side dry
// run: the webhook creates nothing then).
func injected(t *testing.T, c *framework.Cluster, ns, manifest string) string {
	t.Helper()
	out, err := c.KubectlStdin([]byte(manifest), "-n", ns, "create", "--dry-run=server", "-f", "-",
		"-o", "jsonpath={.spec.resourceClaims[*].resourceClaimTemplateName}")
	if err != nil {
		t.Fatalf("dry-run of an annotated pod: %v", err)
	}
	return out
}

// webhookSeesShares waits until the webhook gives the annotated pod of manifest a template other
// than the one it gave while every GPU was whole: its replicas learn the new slices from their
// informers, a moment after the API server has them, and a review answered before would ask for a
// whole GPU. Ten answers in a row, so that each replica has most likely given one.
func webhookSeesShares(t *testing.T, c *framework.Cluster, ns, manifest, whole string) {
	t.Helper()
	start := time.Now()
	defer func() {
		t.Logf("the webhook asked for shares %s after the slices had their shapes", time.Since(start).Round(time.Millisecond))
	}()
	framework.Eventually(t, time.Minute, "ten answers in a row of the webhook asking for a share", func() (bool, error) {
		for i := range 10 {
			if got := injected(t, c, ns, manifest); got == whole {
				return false, fmt.Errorf("answer %d: the webhook gave %s, the template of a whole GPU", i+1, got)
			}
		}
		return true, nil
	})
}

// gpuPod waits for the pod to run with one device and returns it, its claim and the memory share
// its container sees (GPU_DEVICE_0_MEMORY; empty for a whole GPU).
func gpuPod(t *testing.T, c *framework.Cluster, ns, name string) (*corev1.Pod, *claimInfo, string) {
	t.Helper()
	pod, claim := running(t, c, ns, name)
	if len(claim.Devices) != 1 {
		t.Fatalf("%s: claim %s has devices %v, want one", name, claim.Name, claim.Devices)
	}
	memory := ""
	for _, kv := range strings.Split(c.Kubectl(t, "-n", ns, "exec", name, "--", "env"), "\n") {
		if v, ok := strings.CutPrefix(kv, "GPU_DEVICE_0_MEMORY="); ok {
			memory = strings.TrimSpace(v)
		}
	}
	t.Logf("%s on %s: %v, memory share %q", name, pod.Spec.NodeName, claim.Devices, memory)
	return pod, claim, memory
}

// partitions runs the upstream partitionable-devices example, which asks for two devices of the
// class (whole GPUs of another node would do as well), pinned to the partitioned node: it gets two
// partitions.
func partitions(t *testing.T, c *framework.Cluster, partitioned node) {
	t.Helper()
	raw, err := os.ReadFile("../testdata/upstream/partitionable-devices.yaml")
	if err != nil {
		t.Fatal(err)
	}
	manifest := strings.Replace(string(raw), "\nspec:\n  restartPolicy: Never\n",
		"\nspec:\n  nodeSelector: {kubernetes.io/hostname: "+partitioned.Name+"}\n  restartPolicy: Never\n", 1)
	// Registered first, so that it runs even when the apply fails half-way; it waits, so that the
	// next run does not find the namespace still terminating.
	t.Cleanup(func() { _, _ = c.KubectlErr("delete", "namespace", "partitionable-devices", "--timeout=2m") })
	c.ApplyManifest(t, []byte(manifest))
	_, claim := running(t, c, "partitionable-devices", "pod0")
	t.Logf("pod0 on %s: %v", partitioned.Name, claim.Devices)
	if len(claim.Devices) != 2 || !strings.Contains(claim.Devices[0], "partition") || !strings.Contains(claim.Devices[1], "partition") {
		t.Errorf("pod0 got %v, want two partitions of %s", claim.Devices, partitioned.Name)
	}
}

// servesSharing: whether the API server keeps allowMultipleAllocations (a dry-run slice), as the
// plugin's own probe decides.
func servesSharing(t *testing.T, c *framework.Cluster) bool {
	t.Helper()
	got, _, err := c.KubectlAll([]byte(`apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {generateName: e2e-probe-}
spec:
  driver: probe.example.com
  allNodes: true
  pool: {name: probe, resourceSliceCount: 1}
  devices:
  - name: d
    allowMultipleAllocations: true
`), "create", "--dry-run=server", "-o", "jsonpath={.spec.devices[0].allowMultipleAllocations}", "-f", "-")
	if err != nil {
		t.Fatal(err)
	}
	return got == "true"
}

// devicesOf is the devices the node's slices publish (a partitioned node publishes its shared
// counters in a slice of their own).
func devicesOf(ctx context.Context, c *framework.Cluster, nodeName string) ([]resourcev1.Device, error) {
	list, err := c.Clientset.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: "spec.driver=" + driver + ",spec.nodeName=" + nodeName})
	if err != nil {
		return nil, err
	}
	var out []resourcev1.Device
	for _, s := range list.Items {
		out = append(out, s.Spec.Devices...)
	}
	return out, nil
}

// shape: partitioned (partition devices), shared (devices allowing several allocations) or
// exclusive.
func shape(devices []resourcev1.Device) string {
	if slices.ContainsFunc(devices, func(d resourcev1.Device) bool { return strings.Contains(d.Name, "partition") }) {
		return "partitioned"
	}
	if slices.ContainsFunc(devices, func(d resourcev1.Device) bool {
		return d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations
	}) {
		return "shared"
	}
	return "exclusive"
}
