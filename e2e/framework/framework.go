// Package framework is the small toolbox of the end-to-end suite: the cluster under test, kubectl,
// namespaces, waiting, and host processes on the local cluster's node.
package framework

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// Cluster is the cluster under test: the one $KUBECONFIG names.
type Cluster struct {
	Kubeconfig string
	Clientset  kubernetes.Interface
	// Local is true on the harness's own cluster (e2e/cluster): the node is this machine, so tests
	// may run host processes and read host paths such as /var/run/cdi.
	Local bool
	// NodeName of the local cluster's node.
	NodeName string
	// K8sBin holds the cluster's own binaries (kubectl, dra-test-driver) on a local cluster.
	K8sBin string
	// CRIEndpoint is the local node's container runtime (for crictl).
	CRIEndpoint string
}

// Setup returns the cluster, or skips loudly without one — except in CI (CI=true), where a missing
// cluster is a failure: `make e2e` always provides one.
func Setup(t *testing.T) *Cluster {
	t.Helper()
	kc := os.Getenv("KUBECONFIG")
	if kc == "" {
		msg := "needs a cluster: run `make e2e` (starts a local one) or set KUBECONFIG"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED: " + msg)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", kc, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &Cluster{
		Kubeconfig:  kc,
		Clientset:   cs,
		Local:       os.Getenv("GPU_DRA_LOCAL_CLUSTER") == "1",
		NodeName:    os.Getenv("GPU_DRA_NODE_NAME"),
		K8sBin:      os.Getenv("GPU_DRA_K8S_BIN"),
		CRIEndpoint: os.Getenv("GPU_DRA_CRI_ENDPOINT"),
	}
}

// RequireLocal skips (fails in CI) a test that needs the harness's own node.
func (c *Cluster) RequireLocal(t *testing.T, why string) {
	t.Helper()
	if c.Local {
		return
	}
	msg := "needs the local harness cluster (" + why + "); this cluster came from KUBECONFIG"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip("SKIPPED: " + msg)
}

// Kubectl runs kubectl against the cluster and returns stdout; it fails the test on error.
func (c *Cluster) Kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := c.KubectlErr(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// KubectlErr runs kubectl and returns stdout, or an error carrying stderr.
func (c *Cluster) KubectlErr(args ...string) (string, error) {
	return c.KubectlStdin(nil, args...)
}

// KubectlStdin runs kubectl with stdin.
func (c *Cluster) KubectlStdin(stdin []byte, args ...string) (string, error) {
	stdout, _, err := c.kubectl(stdin, args...)
	return stdout, err
}

// ApplyManifest applies a manifest that creates its own namespace as well as pods in it (the
// upstream demos). Until the service account controller has made the namespace's default service
// account, the API server refuses the pods; on a loaded machine that takes seconds, so the apply
// is repeated (it is idempotent) for up to a minute while that is the only reason it fails.
func (c *Cluster) ApplyManifest(t *testing.T, manifest []byte, args ...string) string {
	t.Helper()
	args = append([]string{"apply", "-f", "-"}, args...)
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := c.KubectlStdin(manifest, args...)
		if err == nil {
			return out
		}
		if !strings.Contains(err.Error(), `serviceaccount "default" not found`) || time.Now().After(deadline) {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		time.Sleep(time.Second)
	}
}

// KubectlWarnings runs kubectl, fails the test on error and returns stdout and stderr, where
// kubectl prints the warnings admission webhooks return.
func (c *Cluster) KubectlWarnings(t *testing.T, stdin []byte, args ...string) (stdout, stderr string) {
	t.Helper()
	stdout, stderr, err := c.kubectl(stdin, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	return stdout, stderr
}

// KubectlAll runs kubectl with stdin (nil for none) and returns stdout, stderr (where the warnings
// of admission webhooks are) and the error, for a test that expects either outcome.
func (c *Cluster) KubectlAll(stdin []byte, args ...string) (stdout, stderr string, err error) {
	return c.kubectl(stdin, args...)
}

func (c *Cluster) kubectl(stdin []byte, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), stderr.String(), fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), stderr.String(), nil
}

// Namespace creates a namespace for one test and deletes it afterwards.
func (c *Cluster) Namespace(t *testing.T, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s-%05d", prefix, rand.IntN(100000))
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.Clientset.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	// Pods need the namespace's default service account.
	Eventually(t, time.Minute, "service account default in "+name, func() (bool, error) {
		_, err := c.Clientset.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	t.Cleanup(func() {
		if t.Failed() {
			c.dump(t, name)
		}
		_ = c.Clientset.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

func (c *Cluster) dump(t *testing.T, ns string) {
	out, _ := c.KubectlErr("-n", ns, "get", "pods,resourceclaims,events", "-o", "wide")
	t.Logf("namespace %s at failure:\n%s", ns, out)
}

// Eventually polls cond every 500ms until it is true, fails on error or after timeout.
func Eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		ok, err := cond()
		if ok {
			return
		}
		lastErr = err
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, lastErr)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// WaitForPodPhase waits for the pod to reach one of the phases and returns the pod.
func (c *Cluster) WaitForPodPhase(t *testing.T, ns, name string, timeout time.Duration, phases ...corev1.PodPhase) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	Eventually(t, timeout, fmt.Sprintf("pod %s/%s in phase %v", ns, name, phases), func() (bool, error) {
		p, err := c.Clientset.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		for _, ph := range phases {
			if p.Status.Phase == ph {
				return true, nil
			}
		}
		if p.Status.Phase == corev1.PodFailed {
			return false, fmt.Errorf("pod failed: %s", p.Status.Message)
		}
		return false, fmt.Errorf("phase %s", p.Status.Phase)
	})
	return pod
}

// NewestResourceVersion is the newest resource.k8s.io version the cluster serves (v1, v1beta2 or
// v1beta1), so one suite runs on 1.32 through 1.37.
func (c *Cluster) NewestResourceVersion(t *testing.T) string {
	t.Helper()
	v, err := resourceversion.Newest(c.Clientset.Discovery())
	if err != nil {
		t.Fatal(err)
	}
	return v
}
