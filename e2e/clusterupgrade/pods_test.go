package clusterupgrade

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// runningPod is what must not change about a pod while the cluster is upgraded under it.
type runningPod struct {
	name        string
	uid         types.UID
	containerID string
	env         []string
	devices     map[string]string // claim name -> allocated devices
}

func (s *scenario) apply(t *testing.T, manifest string) {
	t.Helper()
	if out, err := s.c.KubectlStdin([]byte(manifest), "-n", s.ns, "apply", "-f", "-"); err != nil {
		t.Fatalf("apply: %v\n%s\n%s", err, out, manifest)
	}
}

// startPod creates the pod, waits until it runs, and checks it sees wantGPUs GPU_DEVICE_<i>
// variables, each naming the device of the same index.
func (s *scenario) startPod(t *testing.T, manifest string, wantGPUs int) runningPod {
	t.Helper()
	name := strings.Fields(strings.SplitN(manifest, "name:", 2)[1])[0]
	s.apply(t, manifest)
	s.c.WaitForPodPhase(t, s.ns, name, 3*time.Minute, corev1.PodRunning)
	p := s.observe(t, name)
	if len(p.env) != wantGPUs {
		t.Fatalf("pod %s sees %q, want %d GPU_DEVICE_<i> variables", name, p.env, wantGPUs)
	}
	for _, kv := range p.env {
		k, v, _ := strings.Cut(kv, "=")
		if strings.TrimPrefix(k, "GPU_DEVICE_") != strings.TrimPrefix(v, "gpu-") {
			t.Errorf("pod %s: %s: variable and device index differ", name, kv)
		}
	}
	return p
}

func (s *scenario) observe(t *testing.T, name string) runningPod {
	t.Helper()
	pod, err := s.c.Clientset.CoreV1().Pods(s.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := runningPod{name: name, uid: pod.UID, devices: map[string]string{}}
	if len(pod.Status.ContainerStatuses) == 1 {
		p.containerID = pod.Status.ContainerStatuses[0].ContainerID
		if n := pod.Status.ContainerStatuses[0].RestartCount; n != 0 {
			t.Errorf("pod %s: container restarted %d times", name, n)
		}
	}
	if pod.Status.Phase == corev1.PodRunning {
		p.env = s.c.GPUEnv(t, s.ns, name)
	}
	claims := map[string]bool{}
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil {
			claims[*rc.ResourceClaimName] = true
		}
	}
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.ResourceClaimName != nil {
			claims[*st.ResourceClaimName] = true
		}
	}
	for claim := range claims {
		p.devices[claim] = s.c.Kubectl(t, "-n", s.ns, "get", "resourceclaim", claim,
			"-o", "jsonpath={.status.allocation.devices.results[*].device}")
	}
	return p
}

// stillRunning checks that the pods run on exactly as before: same pod, same container (never
// restarted), same devices allocated and seen.
func (s *scenario) stillRunning(t *testing.T, pods ...runningPod) {
	t.Helper()
	for _, before := range pods {
		now := s.observe(t, before.name)
		if now.uid != before.uid || now.containerID != before.containerID {
			t.Errorf("pod %s was replaced or restarted: uid %s -> %s, container %s -> %s",
				before.name, before.uid, now.uid, before.containerID, now.containerID)
		}
		if !slices.Equal(now.env, before.env) {
			t.Errorf("pod %s: GPUs seen changed: %q -> %q", before.name, before.env, now.env)
		}
		for claim, devs := range before.devices {
			if now.devices[claim] != devs || devs == "" {
				t.Errorf("pod %s: claim %s allocation changed: %q -> %q", before.name, claim, devs, now.devices[claim])
			}
		}
	}
}

// stopPod deletes the pod and waits until the claims generated for it are gone (the standalone
// claim stays: it is not the pod's).
func (s *scenario) stopPod(t *testing.T, name string) {
	t.Helper()
	s.c.Kubectl(t, "-n", s.ns, "delete", "pod", name, "--wait=true", "--ignore-not-found")
	framework.Eventually(t, 2*time.Minute, "the claims generated for pod "+name+" to be deleted", func() (bool, error) {
		out, err := s.c.KubectlErr("-n", s.ns, "get", "resourceclaims", "-o",
			"jsonpath={range .items[*]}{.metadata.ownerReferences[0].name}{\"\\n\"}{end}")
		return !slices.Contains(strings.Fields(out), name), err
	})
}

// pluginPod is the kubelet plugin's pod on the node: its UID and container tell whether the plugin
// was restarted.
func (s *scenario) pluginPod(t *testing.T) runningPod {
	t.Helper()
	pods, err := s.c.Clientset.CoreV1().Pods(framework.ReleaseNS).List(context.Background(),
		metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=kubelet-plugin"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("want one kubelet plugin pod: %v (%d found)", err, len(pods.Items))
	}
	p := pods.Items[0]
	rp := runningPod{name: p.Name, uid: p.UID}
	if len(p.Status.ContainerStatuses) > 0 {
		rp.containerID = p.Status.ContainerStatuses[0].ContainerID
	}
	return rp
}
