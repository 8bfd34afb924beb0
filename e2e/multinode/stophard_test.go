package multinode

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// TestNodeStoppedHard stops a node that runs a webhook replica and a GPU pod of a Deployment as a
// machine losing power (every process of the node SIGKILLed, its link down), then does what
// upstream asks of an operator for a node that is not coming back: the out-of-service taint. The
// webhook keeps answering from its other replica (after the endpoint controller drops the dead
// one, while the API server may still pick it); the controllers release the dead node's pod's
// claim and the Deployment's new pod gets a GPU on another node; the GPU pods of the other nodes
// keep their containers and prepared claims. It leaves the node stopped: it runs last.
func TestNodeStoppedHard(t *testing.T) {
	c, nodes := setup(t, 3)
	install(t, c, nodes)
	ctx := context.Background()
	webhooks, err := c.Clientset.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{LabelSelector: webhookSelector})
	if err != nil || len(webhooks.Items) < 2 {
		t.Fatalf("webhook pods: %v (%v)", webhooks, err)
	}
	victim := nodeNamed(t, nodes, webhooks.Items[0].Spec.NodeName)
	for _, p := range webhooks.Items[1:] {
		if p.Spec.NodeName == victim.Name {
			t.Fatalf("both webhook replicas run on %s; the chart spreads them", victim.Name)
		}
	}
	ns := c.Namespace(t, "stop")
	c.Kubectl(t, "-n", ns, "apply", "-f", filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml"))
	// Preferred, not required, on the victim: the replacement may go elsewhere.
	apply(t, c, ns, strings.Replace(drainDeployment, "      terminationGracePeriodSeconds: 1\n",
		"      terminationGracePeriodSeconds: 1\n      affinity: {nodeAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 100, preference: {matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: ["+victim.Name+"]}]}}]}}\n", 1))
	oldPod := appPod(t, c, ns, "")
	pod, oldClaim := running(t, c, ns, oldPod)
	if pod.Spec.NodeName != victim.Name {
		t.Fatalf("the Deployment's pod runs on %s, not on %s, which it prefers", pod.Spec.NodeName, victim.Name)
	}
	others := map[string]*claimInfo{}
	before := map[string]string{}
	for _, n := range nodes {
		if n.Name != victim.Name {
			apply(t, c, ns, pinned(framework.TemplatePod("keep-"+n.Name, "example"), n.Name))
		}
	}
	for _, n := range nodes {
		if n.Name != victim.Name {
			_, others[n.Name] = running(t, c, ns, "keep-"+n.Name)
			before[n.Name] = containerID(t, c, ns, "keep-"+n.Name)
		}
	}

	// The webhook, asked every second from now on.
	probe := askWebhook(t, c, ns, time.Second)
	start := time.Now()
	if out, err := framework.Run(t, time.Minute, "../cluster/multinode-stop-node.sh", victim.Name); err != nil {
		t.Fatalf("stop %s: %v\n%s", victim.Name, err, out)
	}
	framework.Eventually(t, 3*time.Minute, victim.Name+" NotReady", func() (bool, error) {
		n, err := c.Clientset.CoreV1().Nodes().Get(ctx, victim.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status != corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	notReady := time.Since(start)
	c.Kubectl(t, "taint", "node", victim.Name, "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute")

	newPod := appPod(t, c, ns, oldPod)
	moved, newClaim := running(t, c, ns, newPod)
	target := nodeNamed(t, nodes, moved.Spec.NodeName)
	if spec, entry := target.holds(t, newClaim.UID); target.Name == victim.Name || !spec || !entry {
		t.Errorf("the new pod on %s: CDI spec %v, checkpoint entry %v", target.Name, spec, entry)
	}
	framework.Eventually(t, 2*time.Minute, "the dead node's claim released", func() (bool, error) {
		_, err := c.Clientset.ResourceV1().ResourceClaims(ns).Get(ctx, oldClaim.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
	released := time.Since(start)

	// The webhook answers again, ten times in a row.
	framework.Eventually(t, 3*time.Minute, "the webhook to answer ten times in a row", probe.answering)
	failed, asked := probe.stop()
	t.Logf("webhook: %d of %d answers failed after the node stopped; node NotReady after %s, claim released after %s",
		len(failed), asked, notReady.Round(time.Second), released.Round(time.Second))

	checkKept(t, c, ns, nodes, others, before)
}

// checkKept: the pods keep-<node> still run the same container, and their nodes still hold their
// claims.
func checkKept(t *testing.T, c *framework.Cluster, ns string, nodes []node, claims map[string]*claimInfo, containers map[string]string) {
	t.Helper()
	for name, claim := range claims {
		n := nodeNamed(t, nodes, name)
		if now := containerID(t, c, ns, "keep-"+name); now != containers[name] {
			t.Errorf("node %s: the GPU pod's container was %s, is %s", name, containers[name], now)
		}
		if spec, entry := n.holds(t, claim.UID); !spec || !entry {
			t.Errorf("node %s: the running pod's claim has CDI spec %v, checkpoint entry %v", name, spec, entry)
		}
	}
}
