package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	draclient "k8s.io/dynamic-resource-allocation/client"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
	"github.com/gpu-dra/gpu-dra/internal/podgroups"
	"github.com/gpu-dra/gpu-dra/webhook/podinject"
)

// The upstream demo's PodGroups are scheduling.k8s.io/v1alpha2, which 1.36 serves; 1.37 serves
// v1beta1 (and v1alpha3) instead, with the same fields.
const (
	podGroupDemo        = "podgroup-resourceclaimtemplate"
	podGroupDemoVersion = "scheduling.k8s.io/v1alpha2"
	// The webhook's lines about PodGroups (podinject.PodGroupClient).
	podGroupsServedLine    = "PodGroups are served"
	podGroupsNotServedLine = "PodGroups are not served"
)

// TestPodGroups runs the reference driver's podgroup-resourceclaimtemplate demo (image swapped,
// the PodGroups' API version the one the cluster serves): the two pods of each group share one
// GPU, the two groups have different GPUs, and each group has one claim. Pods annotated for GPUs
// in a group whose claim is named gpu-dra share it the same way. Where the cluster serves no
// PodGroups (1.32, 1.34, 1.37 with its default gates) it checks and says what is lacking: the API
// server refuses the demo's PodGroups, and the webhook gives a pod of a group GPUs of its own with
// a warning, and logs once that PodGroups are not served.
func TestPodGroups(t *testing.T) {
	c := framework.Setup(t)
	version := c.NewestResourceVersion(t)
	installForTest(t, c, version)
	waitDevices(t, c, version, 8, "LATEST-GPU-MODEL")

	served := podGroupsServed(t, c)
	if served == "" {
		t.Logf("this cluster serves no PodGroups: the %s demo needs %s (or 1.36 with those gates, GangScheduling and scheduling.k8s.io/v1alpha2; make e2e-podgroups starts such a cluster)", podGroupDemo, podgroups.Needs)
		checkPodGroupsLacking(t, c)
		return
	}
	t.Logf("PodGroups are served in %s", served)

	t.Run(podGroupDemo, func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join("testdata", "upstream", podGroupDemo+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		data = bytes.ReplaceAll(data, []byte("apiVersion: "+podGroupDemoVersion+"\n"), []byte("apiVersion: "+served+"\n"))
		applyManifest(t, c, data, podGroupDemo)
		checkGroupsShare(t, c, podGroupDemo, map[string]string{"group-1": "app=group-1", "group-2": "app=group-2"}, "gpu")
	})

	t.Run("annotated pods share their group's claim", func(t *testing.T) {
		ns := c.Namespace(t, "podgroup-annotated")
		manifest := fmt.Sprintf(annotatedGroupManifest, ns, served, ns, podinject.ClaimName, ns)
		applyManifest(t, c, []byte(manifest), "")
		checkGroupsShare(t, c, ns, map[string]string{"team": "app=team"}, podinject.ClaimName)
	})

	t.Run("webhook log", func(t *testing.T) { checkLoggedOnce(t, c, podGroupsServedLine) })
}

// annotatedGroupManifest: a PodGroup sharing one-gpu under the webhook's claim name, and a
// Deployment of two pods in it that ask for GPUs by annotation only. Arguments: namespace,
// PodGroup apiVersion, namespace, claim name, namespace.
const annotatedGroupManifest = `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: %s}
spec:
  spec:
    devices:
      requests:
      - {name: gpu, exactly: {deviceClassName: gpu.example.com}}
---
apiVersion: %s
kind: PodGroup
metadata: {name: team, namespace: %s}
spec:
  schedulingPolicy: {gang: {minCount: 2}}
  resourceClaims:
  - {name: %s, resourceClaimTemplateName: one-gpu}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: team, namespace: %s}
spec:
  replicas: 2
  selector: {matchLabels: {app: team}}
  template:
    metadata:
      labels: {app: team}
      annotations: {gpu.example.com/count: "1"}
    spec:
      schedulingGroup: {podGroupName: team}
      containers:
      - name: ctr0
        image: busybox:1.37.0-glibc
        command: [sh, -c, "trap 'exit 0' TERM; sleep 9999 & wait"]
`

// applyManifest applies data; a non-empty namespace is deleted afterwards.
func applyManifest(t *testing.T, c *framework.Cluster, data []byte, namespace string) {
	t.Helper()
	if namespace != "" {
		t.Cleanup(func() {
			if t.Failed() {
				out, _ := c.KubectlErr("-n", namespace, "get", "pods,resourceclaims,podgroups,events", "-o", "wide")
				t.Logf("namespace %s at failure:\n%s", namespace, out)
			}
			_, _ = c.KubectlErr("delete", "namespace", namespace, "--wait=true", "--timeout=2m")
		})
	}
	c.ApplyManifest(t, data)
}

// checkGroupsShare waits for two running pods per group (by label selector) and checks that a
// group's pods see one GPU, the same, that groups see different ones, and that the namespace has
// one claim per group, reserved for the group, its pods naming it under podClaim.
func checkGroupsShare(t *testing.T, c *framework.Cluster, ns string, groups map[string]string, podClaim string) {
	t.Helper()
	ctx := context.Background()
	gpuOf := map[string]string{}
	for group, selector := range groups {
		var pods []corev1.Pod
		framework.Eventually(t, 3*time.Minute, "two running pods of "+group, func() (bool, error) {
			list, err := c.Clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				return false, err
			}
			pods = slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return p.Status.Phase != corev1.PodRunning })
			return len(pods) == 2, nil
		})
		var seen []string
		for _, pod := range pods {
			env := c.GPUEnv(t, ns, pod.Name)
			if len(env) != 1 {
				t.Fatalf("%s sees %q, want one GPU_DEVICE_<i>", pod.Name, env)
			}
			seen = append(seen, env[0])
			if len(pod.Status.ResourceClaimStatuses) != 1 || pod.Status.ResourceClaimStatuses[0].Name != podClaim {
				t.Errorf("%s: resourceClaimStatuses %+v, want one for %s", pod.Name, pod.Status.ResourceClaimStatuses, podClaim)
			}
		}
		if seen[0] != seen[1] {
			t.Errorf("the pods of %s see %q and %q, want one GPU for the group", group, seen[0], seen[1])
		}
		for other, gpu := range gpuOf {
			if gpu == seen[0] {
				t.Errorf("groups %s and %s both got %s", group, other, gpu)
			}
		}
		gpuOf[group] = seen[0]
	}
	t.Logf("GPUs by group: %v", gpuOf)
	claims, err := draclient.New(c.Clientset).ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(claims.Items) != len(groups) {
		t.Errorf("%d claims in %s, want one per group (%d)", len(claims.Items), ns, len(groups))
	}
	for _, claim := range claims.Items {
		owner := metav1.GetControllerOf(&claim)
		if owner == nil || owner.Kind != "PodGroup" || groups[owner.Name] == "" {
			t.Errorf("claim %s is controlled by %+v, want one of the PodGroups", claim.Name, owner)
		}
		if owner != nil && !slices.ContainsFunc(claim.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool {
			return r.Resource == "podgroups" && r.Name == owner.Name
		}) {
			t.Errorf("claim %s is reserved for %+v, want its PodGroup %s", claim.Name, claim.Status.ReservedFor, owner.Name)
		}
	}
}

// podGroupsServed is the scheduling.k8s.io group/version serving podgroups, "" for none, found as
// the webhook finds it.
func podGroupsServed(t *testing.T, c *framework.Cluster) string {
	t.Helper()
	v, err := podgroups.ServedVersion(c.Clientset.Discovery())
	if err != nil {
		t.Fatal(err)
	}
	if v == "" {
		return ""
	}
	return podgroups.Group + "/" + v
}

// checkPodGroupsLacking: the demo's PodGroups are refused with the API server's own words. A GPU
// pod naming a group is refused too where pods have no spec.schedulingGroup (before 1.36); where
// they have it but PodGroups are not served (1.37 with its default gates), the pod gets GPUs of its
// own with the webhook's warning, and the webhook says once that PodGroups are not served.
func checkPodGroupsLacking(t *testing.T, c *framework.Cluster) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "upstream", podGroupDemo+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.KubectlErr("delete", "namespace", podGroupDemo, "--wait=true", "--timeout=2m") })
	out, err := c.KubectlStdin(data, "apply", "-f", "-")
	if err == nil || !strings.Contains(err.Error(), `no matches for kind "PodGroup"`) {
		t.Errorf("applying the %s demo without PodGroups: %v\n%s; want the API server to refuse its PodGroups", podGroupDemo, err, out)
	}
	t.Logf("the API server refuses the demo: %v", err)
	ns := c.Namespace(t, "podgroup-lacking")
	pod := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"worker","namespace":%q,"annotations":{"gpu.example.com/count":"1"}},
"spec":{"schedulingGroup":{"podGroupName":"group-1"},"containers":[{"name":"ctr0","image":"busybox:1.37.0-glibc","command":["sh","-c","sleep 9999"]}]}}`, ns)
	_, stderr, err := c.KubectlAll([]byte(pod), "create", "-f", "-")
	if err != nil {
		if !strings.Contains(err.Error(), `unknown field "spec.schedulingGroup"`) {
			t.Fatalf("creating a GPU pod of a group: %v", err)
		}
		t.Logf("pods have no spec.schedulingGroup here (Kubernetes 1.36+): %v", err)
		return
	}
	if !strings.Contains(stderr, podinject.NotServedWarning) {
		t.Errorf("creating a GPU pod of a group: stderr %q, want the warning %q", stderr, podinject.NotServedWarning)
	}
	got := c.WaitForPodPhase(t, ns, "worker", 2*time.Minute, corev1.PodRunning)
	if len(got.Spec.ResourceClaims) != 1 || got.Spec.ResourceClaims[0].ResourceClaimTemplateName == nil {
		t.Errorf("pod's resourceClaims %+v, want its own managed template", got.Spec.ResourceClaims)
	}
	if env := c.GPUEnv(t, ns, "worker"); len(env) != 1 {
		t.Errorf("the pod sees %q, want a GPU of its own", env)
	}
	checkLoggedOnce(t, c, podGroupsNotServedLine)
}

// checkLoggedOnce: line is in the webhook's logs, at most once per webhook pod.
func checkLoggedOnce(t *testing.T, c *framework.Cluster, line string) {
	t.Helper()
	pods, err := c.Clientset.CoreV1().Pods(releaseNS).List(context.Background(), metav1.ListOptions{LabelSelector: webhookSelector})
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, p := range pods.Items {
		logs, _ := c.KubectlErr("-n", releaseNS, "logs", p.Name, "--tail=-1")
		n := strings.Count(logs, line)
		if n > 1 {
			t.Errorf("webhook pod %s logged %q %d times, want at most once", p.Name, line, n)
		}
		total += n
	}
	if total == 0 {
		t.Errorf("no webhook pod logged %q", line)
	}
}
