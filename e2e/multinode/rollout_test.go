package multinode

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// TestPluginRollingUpgrade is `helm upgrade` rolling the plugin's DaemonSet across the nodes while
// a pod with a GPU runs on each: the plugin is replaced node by node (at most one node with two
// plugin pods at any time, the chart's maxSurge 1), the running pods keep their containers, devices
// and prepared claims throughout, and afterwards each node's new plugin prepares a new claim.
func TestPluginRollingUpgrade(t *testing.T) {
	c, nodes := setup(t, 2)
	install(t, c, nodes)
	ns := c.Namespace(t, "rollout")
	c.Kubectl(t, "-n", ns, "apply", "-f", filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml"))
	type holder struct {
		container string
		env       []string
		claim     *claimInfo
	}
	holders := map[string]holder{}
	for _, n := range nodes {
		apply(t, c, ns, pinned(framework.TemplatePod("hold-"+n.Name, "example"), n.Name))
	}
	for _, n := range nodes {
		_, claim := running(t, c, ns, "hold-"+n.Name)
		holders[n.Name] = holder{containerID(t, c, ns, "hold-"+n.Name), c.GPUEnv(t, ns, "hold-"+n.Name), claim}
	}
	before := pluginPods(t, c)

	watch := watchRollout(c, ns, nodes, func(n string) string { return holders[n].container })
	start := time.Now()
	c.Helm(t, "upgrade", framework.Release, chartDir, "-n", releaseNS, "--reuse-values", "--wait", "--timeout", "5m",
		"--set-string", "kubeletPlugin.podAnnotations.e2e-rollout="+start.Format("150405"))
	ds := before[nodes[0].Name].OwnerReferences[0].Name
	c.Kubectl(t, "-n", releaseNS, "rollout", "status", "daemonset/"+ds, "--timeout=5m")
	maxDoubled, changed := watch.stop()
	t.Logf("plugin rolled out on %d nodes in %s; at most %d node(s) at a time had an old and a new plugin pod",
		len(nodes), time.Since(start).Round(time.Second), maxDoubled)

	after := pluginPods(t, c)
	for _, n := range nodes {
		if after[n.Name].UID == "" || after[n.Name].UID == before[n.Name].UID {
			t.Errorf("node %s: plugin pod %s not replaced by the upgrade", n.Name, before[n.Name].Name)
		}
	}
	if maxDoubled > 1 {
		t.Errorf("%d nodes had two plugin pods at once, want the rollout to go node by node", maxDoubled)
	}
	if len(changed) > 0 {
		t.Errorf("containers of the running GPU pods changed during the rollout: %v", changed)
	}
	for _, n := range nodes {
		h := holders[n.Name]
		if now := containerID(t, c, ns, "hold-"+n.Name); now != h.container {
			t.Errorf("node %s: the GPU pod's container was %s, is %s", n.Name, h.container, now)
		}
		if env := c.GPUEnv(t, ns, "hold-"+n.Name); !slices.Equal(env, h.env) {
			t.Errorf("node %s: the GPU pod saw %v, sees %v", n.Name, h.env, env)
		}
		if spec, entry := n.holds(t, h.claim.UID); !spec || !entry {
			t.Errorf("node %s: after the rollout the running pod's claim has CDI spec %v, checkpoint entry %v", n.Name, spec, entry)
		}
		apply(t, c, ns, pinned(framework.TemplatePod("after-"+n.Name, "example"), n.Name))
	}
	for _, n := range nodes {
		pod, claim := running(t, c, ns, "after-"+n.Name)
		if len(claim.Devices) != 1 || slices.Contains(holders[n.Name].claim.Devices, claim.Devices[0]) {
			t.Errorf("node %s: new pod got %v beside the running pod's %v", n.Name, claim.Devices, holders[n.Name].claim.Devices)
		}
		if spec, entry := n.holds(t, claim.UID); !spec || !entry {
			t.Errorf("node %s: the new plugin prepared %s: CDI spec %v, checkpoint entry %v", n.Name, pod.Name, spec, entry)
		}
	}
}

// rolloutWatch looks every 200 ms at the plugin's pods per node and at the containers of the pods
// hold-<node> in ns while a rollout goes on.
type rolloutWatch struct {
	mu         sync.Mutex
	maxDoubled int      // most nodes with two plugin pods (not terminating) at once
	changed    []string // containers of hold-<node> that differed from want
	quit, done chan struct{}
}

func watchRollout(c *framework.Cluster, ns string, nodes []node, want func(node string) string) *rolloutWatch {
	w := &rolloutWatch{quit: make(chan struct{}), done: make(chan struct{})}
	ctx := context.Background()
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.quit:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if list, err := c.Clientset.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{LabelSelector: pluginSelector}); err == nil {
				per := map[string]int{}
				for _, p := range list.Items {
					// A replaced pod still terminating is not a surge.
					if p.DeletionTimestamp == nil {
						per[p.Spec.NodeName]++
					}
				}
				doubled := 0
				for _, k := range per {
					if k > 1 {
						doubled++
					}
				}
				w.mu.Lock()
				w.maxDoubled = max(w.maxDoubled, doubled)
				w.mu.Unlock()
			}
			for _, n := range nodes {
				p, err := c.Clientset.CoreV1().Pods(ns).Get(ctx, "hold-"+n.Name, metav1.GetOptions{})
				if err != nil {
					continue
				}
				now := containerOf(p)
				w.mu.Lock()
				if now != want(n.Name) && !slices.Contains(w.changed, n.Name+": "+now) {
					w.changed = append(w.changed, n.Name+": "+now)
				}
				w.mu.Unlock()
			}
		}
	}()
	return w
}

func (w *rolloutWatch) stop() (maxDoubled int, changed []string) {
	close(w.quit)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.maxDoubled, w.changed
}

// rolloutSettle is how long the webhook is asked on after the last old replica exited: a review
// still routed to one would fail then.
const rolloutSettle = 5 * time.Second

// TestWebhookRollout restarts the webhook's Deployment (what `helm upgrade` does when the image or
// the inventory changes; its replicas run on different nodes) while the webhook is asked ten
// times a second. Unlike a node lost, a planned rollout must lose no review: every ask is
// answered by the webhook, none fails calling it or hangs. A replica keeps serving, not ready, for
// webhook.shutdownDelaySeconds after SIGTERM, until the Service's endpoints and kube-proxy have
// dropped it.
func TestWebhookRollout(t *testing.T) {
	c, nodes := setup(t, 2)
	install(t, c, nodes)
	ns := c.Namespace(t, "webhook-rollout")
	deployment := "deployment/" + framework.Release + "-webhook"
	old := webhookPods(t, c)

	probe := askWebhook(t, c, ns, 100*time.Millisecond)
	time.Sleep(2 * time.Second)
	start := time.Now()
	c.Kubectl(t, "-n", releaseNS, "rollout", "restart", deployment)
	c.Kubectl(t, "-n", releaseNS, "rollout", "status", deployment, "--timeout=3m")
	// `rollout status` returns once the new replicas are available; the old ones may still be
	// draining, and that is where a review is lost.
	framework.Eventually(t, 2*time.Minute, "the old webhook replicas to exit", func() (bool, error) {
		for _, p := range webhookPods(t, c) {
			if slices.Contains(old, p) {
				return false, nil
			}
		}
		return true, nil
	})
	rolled := time.Since(start)
	time.Sleep(rolloutSettle)
	failed, asked := probe.stop()
	for _, err := range failed {
		t.Error(err)
	}
	t.Logf("webhook rolled out in %s (until the old replicas exited); %d of %d asks not answered by the webhook",
		rolled.Round(time.Second), len(failed), asked)
}

// webhookPods are the names of the webhook's pods, terminating ones included.
func webhookPods(t *testing.T, c *framework.Cluster) []string {
	t.Helper()
	return strings.Fields(c.Kubectl(t, "-n", releaseNS, "get", "pods", "-l", webhookSelector, "-o", "jsonpath={.items[*].metadata.name}"))
}
