package multinode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/gpu-dra/gpu-dra/cmd/kubectl-dra/app"
	"github.com/gpu-dra/gpu-dra/driver/cdi"
	"github.com/gpu-dra/gpu-dra/e2e/framework"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
)

// TestSeedThreeNodes is the seed's cluster: three GPU nodes, each publishing one ResourceSlice
// (`kubectl get resourceslice` as the seed shows it: the node's name in NAME, NODE and POOL), and
// the seed's template and pod on each node, prepared by that node's plugin: the CDI spec is in
// that node's /var/run/cdi and checkpoint only, the container sees the device it was allocated,
// and when the pods go every node's plugin unprepares.
func TestSeedThreeNodes(t *testing.T) {
	c, nodes := setup(t, 3)
	install(t, c, nodes)

	table := c.Kubectl(t, "get", "resourceslice")
	t.Logf("kubectl get resourceslice:\n%s", table)
	checkSliceTable(t, table, nodes)

	ns := c.Namespace(t, "seed")
	c.Kubectl(t, "-n", ns, "apply", "-f", filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml"))
	for _, n := range nodes {
		if _, err := c.KubectlStdin([]byte(seedPod("seed-"+n.Name, n.Name)), "-n", ns, "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
	}
	claims := map[string]types.UID{}
	for _, n := range nodes {
		pod := c.WaitForPodPhase(t, ns, "seed-"+n.Name, 2*time.Minute, corev1.PodRunning)
		claim := claimOf(t, c, pod)
		claims[n.Name] = claim.UID
		devices := claim.Devices
		if len(devices) != 1 || !strings.HasPrefix(devices[0], n.Name+"/") {
			t.Fatalf("pod on %s: claim %s allocated %v, want one device of pool %s", n.Name, claim.Name, devices, n.Name)
		}
		gpu := strings.TrimPrefix(devices[0], n.Name+"/")
		env := c.GPUEnv(t, ns, pod.Name)
		if len(env) != 1 || !strings.HasSuffix(env[0], "="+gpu) {
			t.Errorf("pod on %s sees %v, want the one device it was allocated, %s", n.Name, env, gpu)
		}
		t.Logf("%s: pod %s, claim %s, device %s, container sees %v", n.Name, pod.Name, claim.Name, devices[0], env)
	}
	checkStatus(t, c, ns, nodes)
	// Each claim is prepared where its pod runs and nowhere else, not in the host's /var/run/cdi
	// either (which a single-node cluster beside this one may use).
	host, err := cdi.NewWriter(cdi.DefaultRoot, driver)
	if err != nil {
		t.Fatal(err)
	}
	for owner, uid := range claims {
		for _, n := range nodes {
			spec, entry := n.holds(t, uid)
			if want := n.Name == owner; spec != want || entry != want {
				t.Errorf("claim of the pod on %s: on node %s CDI spec %v, checkpoint entry %v; want %v", owner, n.Name, spec, entry, want)
			}
		}
		if host.Exists(uid) {
			t.Errorf("claim of the pod on %s has a CDI spec in the host's %s", owner, cdi.DefaultRoot)
		}
	}

	c.Kubectl(t, "-n", ns, "delete", "pods", "--all", "--wait")
	framework.Eventually(t, 2*time.Minute, "every node's plugin to unprepare its claim", func() (bool, error) {
		for owner, uid := range claims {
			for _, n := range nodes {
				specs, entries, err := n.prepared()
				if err != nil {
					return false, err
				}
				for _, u := range append(specs, entries...) {
					if u == uid {
						return false, fmt.Errorf("node %s still holds the claim of the pod on %s", n.Name, owner)
					}
				}
			}
		}
		return true, nil
	})
}

// checkSliceTable checks `kubectl get resourceslice`: the seed's columns and one row per node,
// its name holding the driver and the node, with the node as NODE and POOL.
func checkSliceTable(t *testing.T, table string, nodes []node) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != "NAME NODE DRIVER POOL AGE" {
		t.Errorf("columns %v, want the seed's NAME NODE DRIVER POOL AGE", got)
	}
	rows := map[string]int{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) != 5 || f[2] != driver {
			continue
		}
		// The seed's names are <node>-<driver>-<suffix>; k8s.io/dynamic-resource-allocation 0.37
		// names them <index>-<driver>-<node>-<suffix>.
		if f[1] != f[3] || !strings.Contains(f[0], "-"+driver+"-") || !strings.Contains(f[0], f[1]+"-") {
			t.Errorf("row %q: want a NAME with the driver and the node, the node as NODE and POOL", l)
		}
		rows[f[1]]++
	}
	for _, n := range nodes {
		if rows[n.Name] != 1 {
			t.Errorf("node %s has %d rows, want 1", n.Name, rows[n.Name])
		}
	}
	if len(rows) != len(nodes) {
		t.Errorf("slices of %d nodes, want %d", len(rows), len(nodes))
	}
}

// seedPod is the seed's pod, named and pinned to a node, sleeping long enough for the checks.
func seedPod(name, nodeName string) string {
	raw, err := os.ReadFile(filepath.Join(seedDir, "pod.yaml"))
	if err != nil {
		panic(err)
	}
	s := strings.Replace(string(raw), "name: example-claim", "name: "+name, 1)
	s = strings.Replace(s, "sleep 1m", "sleep 10m", 1)
	return strings.Replace(s, "\nspec:\n", "\nspec:\n  nodeSelector:\n    kubernetes.io/hostname: "+nodeName+"\n", 1)
}

// claimOf is the pod's (first) ResourceClaim.
func claimOf(t *testing.T, c *framework.Cluster, pod *corev1.Pod) *claimInfo {
	t.Helper()
	if len(pod.Status.ResourceClaimStatuses) == 0 || pod.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("pod %s/%s has no ResourceClaim", pod.Namespace, pod.Name)
	}
	name := *pod.Status.ResourceClaimStatuses[0].ResourceClaimName
	rc, err := c.Clientset.ResourceV1().ResourceClaims(pod.Namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info := &claimInfo{Name: rc.Name, UID: rc.UID}
	if rc.Status.Allocation != nil {
		for _, r := range rc.Status.Allocation.Devices.Results {
			info.Devices = append(info.Devices, r.Pool+"/"+r.Device)
		}
	}
	return info
}

type claimInfo struct {
	Name    string
	UID     types.UID
	Devices []string // pool/device
}

// checkStatus: `kubectl dra status` groups the real nodes: each node's 8 GPUs under its name, the
// seed's pod of that node holding one of them.
func checkStatus(t *testing.T, c *framework.Cluster, ns string, nodes []node) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := app.NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs([]string{"status", "-o", "json", "--kubeconfig", c.Kubeconfig})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("kubectl dra status: %v\n%s", err, errOut.String())
	}
	var rep deviceusage.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{} // node: device pod, for every allocation
	devices := map[string]int{}
	for _, n := range rep.Nodes {
		devices[n.Name] = len(n.Devices)
		for _, d := range n.Devices {
			for _, a := range d.Allocations {
				got[n.Name] = append(got[n.Name], d.Name+" "+strings.Join(a.Pods, ","))
			}
		}
	}
	for _, n := range nodes {
		// Pods of earlier tests may still be going; the seed's pod of the node must be there.
		seed := slices.ContainsFunc(got[n.Name], func(s string) bool { return strings.HasSuffix(s, " "+ns+"/seed-"+n.Name) })
		if devices[n.Name] != 8 || !seed {
			t.Errorf("kubectl dra status, node %s: %d devices, held: %v; want its 8 GPUs, one held by %s/seed-%s", n.Name, devices[n.Name], got[n.Name], ns, n.Name)
		}
	}
	if len(rep.Nodes) != len(nodes) {
		t.Errorf("kubectl dra status shows %d nodes, want %d", len(rep.Nodes), len(nodes))
	}
	t.Logf("kubectl dra status: %v", got)
}
