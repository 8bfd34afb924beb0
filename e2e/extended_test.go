package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// capabilities are what a release serves with the flags the harness starts it with (1.32 with the
// seed's beta flags, the others with their defaults).
type capabilities struct {
	// extendedResources: the API server keeps DeviceClass extendedResourceName and the scheduler
	// serves pods' limits through DRA itself (KEP-5004).
	extendedResources bool
	// firstAvailable: the API server keeps a request's firstAvailable (KEP-4816).
	firstAvailable bool
	// adminAccessLabel: the API server serves adminAccess only in labelled namespaces (KEP-5018).
	adminAccessLabel bool
}

// releaseCapabilities is one table of every release's answers; the suite detects them from the
// cluster and fails when a release answers otherwise.
var releaseCapabilities = map[string]capabilities{
	"1.32": {},
	"1.34": {firstAvailable: true, adminAccessLabel: true},
	"1.37": {extendedResources: true, firstAvailable: true, adminAccessLabel: true},
}

// TestExtendedResources: one pod manifest asking for GPUs in resources.limits gets them on every
// release, through the API server's own path where it serves it and through the webhook's claim
// elsewhere; the upstream reference's extended-resource demo runs; a model list gets the first
// model available; bad values and a namespace without the admin-access label are refused with the
// fix.
func TestExtendedResources(t *testing.T) {
	c := framework.Setup(t)
	version := c.NewestResourceVersion(t)
	installForTest(t, c, version, "-f", filepath.Join("testdata", "extended", "values.yaml"))

	minor := serverMinor(t, c)
	want, ok := releaseCapabilities[minor]
	if !ok {
		t.Fatalf("no expectations for Kubernetes %s", minor)
	}
	got := detect(t, c, version)
	t.Logf("Kubernetes %s serves %+v", minor, got)
	if got != want {
		t.Fatalf("Kubernetes %s serves %+v, want %+v", minor, got, want)
	}

	t.Run("limits get two GPUs", func(t *testing.T) {
		ns := c.Namespace(t, "limits")
		c.Kubectl(t, "-n", ns, "apply", "-f", filepath.Join("testdata", "extended", "pod-limits.yaml"))
		checkExtendedPod(t, c, ns, "two-gpus", "app", "gpu.example.com/gpu", 2, got.extendedResources)
		c.Kubectl(t, "-n", ns, "delete", "pod", "two-gpus", "--wait=true")
	})

	t.Run("implicit name of the class", func(t *testing.T) {
		ns := c.Namespace(t, "implicit")
		pod := limitsPod("one-gpu", "deviceclass.resource.kubernetes.io/"+driver, "1")
		if out, err := c.KubectlStdin([]byte(pod), "-n", ns, "apply", "-f", "-"); err != nil {
			t.Fatalf("apply: %v\n%s", err, out)
		}
		checkExtendedPod(t, c, ns, "one-gpu", "app", "deviceclass.resource.kubernetes.io/"+driver, 1, got.extendedResources)
		c.Kubectl(t, "-n", ns, "delete", "pod", "one-gpu", "--wait=true")
	})

	t.Run("upstream extended-resource-request demo", func(t *testing.T) {
		const ns = "extended-resource-request"
		manifest := filepath.Join("testdata", "upstream", "extended-resource-request.yaml")
		c.Kubectl(t, "apply", "-f", manifest)
		t.Cleanup(func() { _, _ = c.KubectlErr("delete", "-f", manifest, "--wait=true", "--timeout=2m") })
		env0 := checkExtendedPod(t, c, ns, "pod0", "ctr0", "deviceclass.resource.kubernetes.io/"+driver, 1, got.extendedResources)
		env1 := checkExtendedPod(t, c, ns, "pod1", "ctr0", "example.com/gpu", 1, got.extendedResources)
		if slices.Equal(env0, env1) {
			t.Errorf("pod0 and pod1 got the same GPU: %q", env0)
		}
		// The demo's containers print their environment with bash's `export`, here busybox sh's.
		if len(env1) == 1 {
			variable, _, _ := strings.Cut(env1[0], "=")
			if logs := c.Kubectl(t, "-n", ns, "logs", "pod1"); !strings.Contains(logs, variable) {
				t.Errorf("pod1's log does not show its GPU variable %s:\n%s", variable, logs)
			}
		}
	})

	t.Run("model list gets the first available", func(t *testing.T) {
		ns := c.Namespace(t, "models")
		pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: models
  annotations:
    gpu.example.com/count: "1"
    gpu.example.com/model: "A100,LATEST-GPU-MODEL"
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: %s
    command: ["sh", "-c", "trap exit INT TERM; sleep 3600 & wait"]
`, "busybox:1.37.0-glibc")
		out, err := c.KubectlStdin([]byte(pod), "-n", ns, "apply", "-f", "-")
		if !got.firstAvailable {
			for _, want := range []string{`metadata.annotations[gpu.example.com/model]: Invalid value: "A100,LATEST-GPU-MODEL": this cluster does not serve firstAvailable`, `name one model, e.g. "A100"`} {
				if err == nil || !strings.Contains(out+err.Error(), want) {
					t.Errorf("model list on a cluster without firstAvailable: err %v, output %s; want %q", err, out, want)
				}
			}
			return
		}
		if err != nil {
			t.Fatalf("apply: %v\n%s", err, out)
		}
		c.WaitForPodPhase(t, ns, "models", 2*time.Minute, corev1.PodRunning)
		// A100 is not published: the scheduler took the second subrequest.
		result := c.Kubectl(t, "-n", ns, "get", "resourceclaims", "-o", "jsonpath={.items[0].status.allocation.devices.results[*].request}")
		if result != "gpus/model-1" {
			t.Errorf("allocated request %q, want gpus/model-1 (LATEST-GPU-MODEL, the first model published)", result)
		}
		c.Kubectl(t, "-n", ns, "delete", "pod", "models", "--wait=true")
	})

	t.Run("bad values are refused with the field", func(t *testing.T) {
		ns := c.Namespace(t, "bad")
		for _, tc := range []struct {
			value, annotation, ours, apiServer string
		}{
			{value: "0", ours: `spec.containers[0].resources.limits[gpu.example.com/gpu]: Invalid value: "0": 0 GPUs`},
			{value: "-1", ours: `Invalid value: "-1": negative`, apiServer: "must be greater than or equal to 0"},
			{value: "0.5", ours: "not a whole number of GPUs", apiServer: "must be an integer"},
			{value: "1e9", ours: "more than any node of driver gpu.example.com has (8)"},
			{value: "1", annotation: "1", ours: "the pod also asks for GPUs with the annotation gpu.example.com/count"},
		} {
			pod := limitsPod("bad", "gpu.example.com/gpu", tc.value)
			if tc.annotation != "" {
				pod = strings.Replace(pod, "metadata:\n", "metadata:\n  annotations: {gpu.example.com/count: \""+tc.annotation+"\"}\n", 1)
			}
			out, err := c.KubectlStdin([]byte(pod), "-n", ns, "apply", "--dry-run=server", "-f", "-")
			want := tc.ours
			if got.extendedResources && tc.annotation == "" {
				// The webhook stays out of the way; the API server judges what it can.
				want = tc.apiServer
			}
			switch {
			case want == "" && err != nil:
				t.Errorf("limit %s: refused on a cluster that serves it: %v\n%s", tc.value, err, out)
			case want != "" && (err == nil || !strings.Contains(out+err.Error(), want)):
				t.Errorf("limit %s (annotation %q): err %v, output %s; want %q", tc.value, tc.annotation, err, out, want)
			}
		}
	})

	t.Run("admin access outside a labelled namespace", func(t *testing.T) {
		ns := c.Namespace(t, "admin")
		template := adminTemplate(version)
		if !got.adminAccessLabel {
			// The cluster drops adminAccess: admitted, with the webhook saying so (kubectl prints
			// warnings on stderr).
			out, warnings := c.KubectlWarnings(t, []byte(template), "-n", ns, "apply", "-f", "-")
			if !strings.Contains(warnings, "this cluster drops adminAccess") {
				t.Errorf("admin template where adminAccess is dropped: output %s, warnings %s; want the webhook's warning that the cluster drops adminAccess", out, warnings)
			}
			return
		}
		out, err := c.KubectlStdin([]byte(template), "-n", ns, "apply", "-f", "-")
		fix := "kubectl label namespace " + ns + " resource.kubernetes.io/admin-access=true"
		if err == nil || !strings.Contains(out+err.Error(), fix) || !strings.Contains(out+err.Error(), `admission webhook "admin-access.resourceclaims.gpu.example.com" denied the request`) {
			t.Fatalf("admin template in an unlabelled namespace: err %v, output %s; want the webhook's denial with %q", err, out, fix)
		}
		c.Kubectl(t, "label", "namespace", ns, "resource.kubernetes.io/admin-access=true")
		if out, err := c.KubectlStdin([]byte(template), "-n", ns, "apply", "-f", "-"); err != nil {
			t.Errorf("after the fix: %v\n%s", err, out)
		}
	})
}

// serverMinor is the API server's "1.<minor>".
func serverMinor(t *testing.T, c *framework.Cluster) string {
	t.Helper()
	v, err := c.Clientset.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	return v.Major + "." + strings.TrimSuffix(v.Minor, "+")
}

// detect asks the cluster what it serves, as the webhook does but on its own: the chart's class
// read back, and dry-run objects of another driver compared with what came back.
func detect(t *testing.T, c *framework.Cluster, version string) capabilities {
	t.Helper()
	var got capabilities
	ern := c.Kubectl(t, "get", "deviceclasses."+version+".resource.k8s.io", driver, "-o", "jsonpath={.spec.extendedResourceName}")
	got.extendedResources = ern == "gpu.example.com/gpu"
	ns := c.Namespace(t, "probe")
	if version != "v1beta1" {
		fa := `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: probe}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        firstAvailable: [{name: a, deviceClassName: probe.example.org}]
`
		out, err := c.KubectlStdin([]byte(fa), "-n", ns, "create", "--dry-run=server", "-o", "jsonpath={.spec.spec.devices.requests[0].firstAvailable[0].name}", "-f", "-")
		got.firstAvailable = err == nil && out == "a"
	}
	// Another driver's class, so that only the API server judges the probes.
	admin := strings.ReplaceAll(adminTemplate(version), "deviceClassName: gpu.example.com", "deviceClassName: probe.example.org")
	_, err := c.KubectlStdin([]byte(admin), "-n", ns, "create", "--dry-run=server", "-f", "-")
	got.adminAccessLabel = err != nil && strings.Contains(err.Error(), "requires the `resource.kubernetes.io/admin-access: true` label")
	return got
}

// adminTemplate is the upstream admin-access demo's template in the served version's shape.
func adminTemplate(version string) string {
	request := "exactly: {deviceClassName: gpu.example.com, allocationMode: All, adminAccess: true}"
	if version == "v1beta1" {
		request = "deviceClassName: gpu.example.com\n        allocationMode: All\n        adminAccess: true"
	}
	return fmt.Sprintf(`apiVersion: resource.k8s.io/%s
kind: ResourceClaimTemplate
metadata:
  name: multiple-gpus-admin
spec:
  spec:
    devices:
      requests:
      - name: gpu
        %s
`, version, request)
}

// limitsPod asks for value of resource in its one container's limits.
func limitsPod(name, resource, value string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: busybox:1.37.0-glibc
    command: ["sh", "-c", "trap exit INT TERM; sleep 3600 & wait"]
    resources:
      limits:
        %s: %s
`, name, resource, value)
}

// checkExtendedPod waits for the pod, checks it sees count GPUs, and that they came the way the
// cluster serves them: the scheduler's own claim (status.extendedResourceClaimStatus, the limit
// still in the pod, nothing injected) or the webhook's (claim gpu-dra, the limit gone). It returns
// the GPU variables the container sees.
func checkExtendedPod(t *testing.T, c *framework.Cluster, ns, name, container, resource string, count int, served bool) []string {
	t.Helper()
	c.WaitForPodPhase(t, ns, name, 2*time.Minute, corev1.PodRunning)
	env := c.GPUEnv(t, ns, name)
	if len(env) != count {
		t.Errorf("pod %s sees %q, want %d GPU_DEVICE_<i> variables", name, env, count)
	}
	var pod corev1.Pod
	if err := json.Unmarshal([]byte(c.Kubectl(t, "-n", ns, "get", "pod", name, "-o", "json")), &pod); err != nil {
		t.Fatal(err)
	}
	_, limited := pod.Spec.Containers[0].Resources.Limits[corev1.ResourceName(resource)]
	injected := slices.ContainsFunc(pod.Spec.ResourceClaims, func(rc corev1.PodResourceClaim) bool { return rc.Name == "gpu-dra" })
	status := pod.Status.ExtendedResourceClaimStatus
	if served {
		if injected || !limited {
			t.Errorf("pod %s: the webhook injected a claim (%v) or removed the limit (%v) although the cluster serves %s", name, injected, !limited, resource)
		}
		want := corev1.ContainerExtendedResourceRequest{ContainerName: container, ResourceName: resource, RequestName: "container-0-request-0"}
		if status == nil || status.ResourceClaimName == "" || !slices.Contains(status.RequestMappings, want) {
			t.Errorf("pod %s: status.extendedResourceClaimStatus %+v, want a claim and the mapping %+v", name, status, want)
		} else if ann := c.Kubectl(t, "-n", ns, "get", "resourceclaim", status.ResourceClaimName, "-o", `jsonpath={.metadata.annotations.resource\.kubernetes\.io/extended-resource-claim}`); ann != "true" {
			t.Errorf("claim %s is not the scheduler's extended-resource claim (annotation %q)", status.ResourceClaimName, ann)
		}
		return env
	}
	if !injected || limited || status != nil {
		t.Errorf("pod %s: claim injected %v, limit left %v, extendedResourceClaimStatus %+v; want the webhook's claim in place of the limit", name, injected, limited, status)
	}
	return env
}
