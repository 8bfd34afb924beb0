// Package multinode is the end-to-end suite of several GPU nodes: it runs on the multi-node local
// cluster (e2e/cluster/multinode-up.sh, `make e2e-multinode`), where each node is a network and
// mount namespace of this machine with its own kubelet, containerd, CDI directories and plugin
// directory, which the tests read on the host to see what each node's plugin did.
package multinode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-dra/gpu-dra/driver/cdi"
	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

const (
	driver          = framework.Driver
	releaseNS       = framework.ReleaseNS
	pluginSelector  = "app.kubernetes.io/component=kubelet-plugin"
	webhookSelector = "app.kubernetes.io/component=webhook"
	chartDir        = "../../charts/gpu-dra"
	seedDir         = "../testdata/seed"
)

// node is one GPU node of the cluster and where its own directories are on this machine.
type node struct {
	Name string
	// CDIDir is the node's /var/run/cdi, PluginDir its /var/lib/kubelet/plugins/<driver>.
	CDIDir, PluginDir string
}

// installed is set once the chart is installed; TestMain uninstalls it.
var installed struct {
	sync.Mutex
	done bool
	c    *framework.Cluster
}

func TestMain(m *testing.M) {
	code := m.Run()
	installed.Lock()
	if installed.done {
		out, err := exec.Command("helm", "--kubeconfig", installed.c.Kubeconfig, "uninstall", framework.Release,
			"-n", releaseNS, "--wait", "--timeout", "3m").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "helm uninstall: %v\n%s", err, out)
			code = 1
		}
	}
	installed.Unlock()
	os.Exit(code)
}

// setup is the cluster and its GPU nodes; it skips (fails in CI) unless the cluster is the
// multi-node local one with at least want nodes.
func setup(t *testing.T, want int) (*framework.Cluster, []node) {
	t.Helper()
	c := framework.Setup(t)
	state, run := os.Getenv("GPU_DRA_MN_STATE"), os.Getenv("GPU_DRA_MN_RUN")
	if os.Getenv("GPU_DRA_MULTINODE") != "1" || state == "" || run == "" {
		msg := "needs the multi-node local cluster: run `make e2e-multinode`"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED: " + msg)
	}
	list, err := c.Clientset.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var nodes []node
	for _, n := range list.Items {
		nodes = append(nodes, node{
			Name:      n.Name,
			CDIDir:    filepath.Join(run, "nodes", n.Name, "cdi"),
			PluginDir: filepath.Join(state, "nodes", n.Name, "kubelet", "plugins", driver),
		})
	}
	slices.SortFunc(nodes, func(a, b node) int { return strings.Compare(a.Name, b.Name) })
	if len(nodes) < want {
		t.Fatalf("the cluster has %d nodes, this test needs %d: start it with NODES=%d", len(nodes), want, want)
	}
	return c, nodes
}

// install installs the chart with its defaults once for the whole suite, and waits for every
// node's plugin to publish its slice.
func install(t *testing.T, c *framework.Cluster, nodes []node) {
	t.Helper()
	installed.Lock()
	defer installed.Unlock()
	if !installed.done {
		start := time.Now()
		c.InstallChart(t, chartDir, filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml"))
		installed.done, installed.c = true, c
		t.Logf("chart installed in %s", time.Since(start).Round(time.Second))
	}
	waitSlices(t, c, nodes)
}

// waitSlices waits for one ResourceSlice of the driver per node.
func waitSlices(t *testing.T, c *framework.Cluster, nodes []node) {
	t.Helper()
	framework.Eventually(t, 2*time.Minute, "a ResourceSlice on every node", func() (bool, error) {
		got, err := slicesByNode(c)
		if err != nil {
			return false, err
		}
		for _, n := range nodes {
			if len(got[n.Name]) != 1 {
				return false, fmt.Errorf("node %s has %d slices", n.Name, len(got[n.Name]))
			}
		}
		return true, nil
	})
}

// slicesByNode is the names of the driver's ResourceSlices by node.
func slicesByNode(c *framework.Cluster) (map[string][]string, error) {
	list, err := c.Clientset.ResourceV1().ResourceSlices().List(context.Background(),
		metav1.ListOptions{FieldSelector: "spec.driver=" + driver})
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, s := range list.Items {
		n := ""
		if s.Spec.NodeName != nil {
			n = *s.Spec.NodeName
		}
		out[n] = append(out[n], s.Name)
	}
	return out, nil
}

// pluginPods is the plugin's pod on each node.
func pluginPods(t *testing.T, c *framework.Cluster) map[string]corev1.Pod {
	t.Helper()
	list, err := c.Clientset.CoreV1().Pods(releaseNS).List(context.Background(), metav1.ListOptions{LabelSelector: pluginSelector})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]corev1.Pod{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out[p.Spec.NodeName] = p
		}
	}
	return out
}

// prepared is what a node's plugin holds: the claims with a CDI spec in the node's CDI directory
// and the claims in its checkpoint.
func (n node) prepared() (specs, entries []types.UID, err error) {
	w, err := cdi.NewWriter(n.CDIDir, driver)
	if err != nil {
		return nil, nil, err
	}
	if specs, err = w.List(); err != nil {
		return nil, nil, fmt.Errorf("node %s: CDI specs: %w", n.Name, err)
	}
	data, err := checkpoint.Read(filepath.Join(n.PluginDir, checkpoint.FileName))
	if err != nil {
		return nil, nil, fmt.Errorf("node %s: checkpoint: %w", n.Name, err)
	}
	for uid := range data.Claims {
		entries = append(entries, uid)
	}
	return specs, entries, nil
}

// holds reports whether the node's plugin has the claim prepared: a CDI spec and a checkpoint entry.
func (n node) holds(t *testing.T, uid types.UID) (spec, entry bool) {
	t.Helper()
	specs, entries, err := n.prepared()
	if err != nil {
		t.Fatal(err)
	}
	return slices.Contains(specs, uid), slices.Contains(entries, uid)
}
