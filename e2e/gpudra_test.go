package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

const (
	release   = framework.Release
	releaseNS = framework.ReleaseNS
	driver    = framework.Driver
	cdiDir    = "/var/run/cdi"
)

// TestSeedStory replays the seed note on a real cluster with the product installed from its chart:
// install, see 8 GPUs in the node's ResourceSlice, run the seed's template and pod, watch the claim
// go allocated,reserved and away with the pod, use the annotation, get rejected for a bad template,
// uninstall and find nothing left behind.
func TestSeedStory(t *testing.T) {
	c := framework.Setup(t)
	version := c.NewestResourceVersion(t)
	chart := filepath.Join("..", "charts", "gpu-dra")

	installed := false
	t.Cleanup(func() {
		if installed {
			if t.Failed() {
				out, _ := c.KubectlErr("-n", releaseNS, "get", "all,events", "-o", "wide")
				t.Logf("release namespace at failure:\n%s", out)
				for _, sel := range []string{"app.kubernetes.io/component=kubelet-plugin", "app.kubernetes.io/component=webhook"} {
					logs, _ := c.KubectlErr("-n", releaseNS, "logs", "-l", sel, "--tail=60", "--all-containers")
					t.Logf("logs of %s:\n%s", sel, logs)
				}
			}
			c.Helm(t, "uninstall", release, "-n", releaseNS, "--wait", "--timeout", "3m")
		}
	})

	t.Run("install", func(t *testing.T) {
		installed = true // the cleanup uninstalls whatever got installed
		c.InstallChart(t, chart, filepath.Join("testdata", "seed", seedTemplate(version)))
		c.Kubectl(t, "get", "deviceclass", driver)
	})
	if !installed {
		t.FailNow()
	}

	t.Run("node publishes 8 GPUs as in the seed", func(t *testing.T) {
		var devices []sliceDevice
		framework.Eventually(t, 2*time.Minute, "a ResourceSlice with 8 devices", func() (bool, error) {
			var err error
			devices, err = driverDevices(c, version)
			return len(devices) == 8, err
		})
		uuids := map[string]bool{}
		for i, d := range devices {
			if want := fmt.Sprintf("gpu-%d", i); d.Name != want {
				t.Errorf("device %d is %q, want %q", i, d.Name, want)
			}
			if d.Model != "LATEST-GPU-MODEL" || d.DriverVersion != "1.0.0" || d.Memory != "80Gi" || d.Index != i {
				t.Errorf("device %s: %+v, want model LATEST-GPU-MODEL, driverVersion 1.0.0, memory 80Gi, index %d", d.Name, d, i)
			}
			if !strings.HasPrefix(d.UUID, "gpu-") || uuids[d.UUID] {
				t.Errorf("device %s: uuid %q is not a unique gpu-… id", d.Name, d.UUID)
			}
			uuids[d.UUID] = true
		}
	})

	t.Run("seed template and pod", func(t *testing.T) {
		ns := c.Namespace(t, "seed")
		c.Kubectl(t, "-n", ns, "apply", "-f", filepath.Join("testdata", "seed", seedTemplate(version)))
		c.Kubectl(t, "-n", ns, "apply", "-f", filepath.Join("testdata", "seed", "pod.yaml"))
		c.WaitForPodPhase(t, ns, "example-claim", 2*time.Minute, corev1.PodRunning)
		claims := c.Kubectl(t, "-n", ns, "get", "resourceclaims", "--no-headers")
		if !strings.Contains(claims, "allocated,reserved") {
			t.Errorf("claim of the running pod is not allocated,reserved:\n%s", claims)
		}
		if env := c.GPUEnv(t, ns, "example-claim"); len(env) != 1 || !strings.HasPrefix(env[0], "GPU_DEVICE_0=gpu-") {
			t.Errorf("pod env has %q, want GPU_DEVICE_0", env)
		}
		uid := claimUID(t, c, ns)
		claim := strings.TrimSpace(c.Kubectl(t, "-n", ns, "get", "resourceclaims", "-o", "jsonpath={.items[0].metadata.name}"))
		device := strings.TrimPrefix(c.GPUEnv(t, ns, "example-claim")[0], "GPU_DEVICE_0=")
		seriesGone := checkAllocationMetrics(t, c, ns, "example-claim", "sleep-busybox", claim, device)
		c.Kubectl(t, "-n", ns, "delete", "pod", "example-claim", "--wait=true")
		waitClaimsGone(t, c, ns)
		seriesGone()
		if c.Local {
			framework.Eventually(t, time.Minute, "the claim's CDI spec to be removed", func() (bool, error) {
				return len(cdiFilesMatching(t, uid)) == 0, nil
			})
		}
	})

	t.Run("annotated pod gets two GPUs", func(t *testing.T) {
		ns := c.Namespace(t, "annotated")
		pod := framework.AnnotatedPod("two-gpus", 2)
		if out, err := c.KubectlStdin([]byte(pod), "-n", ns, "apply", "-f", "-"); err != nil {
			t.Fatalf("apply annotated pod: %v\n%s", err, out)
		}
		c.WaitForPodPhase(t, ns, "two-gpus", 2*time.Minute, corev1.PodRunning)
		// As with the seed's example driver, the variable is numbered by the device's index:
		// GPU_DEVICE_<i>=gpu-<i>, two of them.
		env := c.GPUEnv(t, ns, "two-gpus")
		if len(env) != 2 {
			t.Errorf("want two GPU_DEVICE_<i> variables, got %q", env)
		}
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			if strings.TrimPrefix(k, "GPU_DEVICE_") != strings.TrimPrefix(v, "gpu-") {
				t.Errorf("%s: variable and device index differ", kv)
			}
		}
		if claims := c.Kubectl(t, "-n", ns, "get", "resourceclaims", "-o", "jsonpath={.items[*].metadata.ownerReferences[0].name}"); claims != "two-gpus" {
			t.Errorf("generated claim owner = %q, want the pod two-gpus", claims)
		}
		c.Kubectl(t, "-n", ns, "delete", "pod", "two-gpus", "--wait=true")
		waitClaimsGone(t, c, ns)

		// A Deployment's pod template carries the annotation; the pods its ReplicaSet creates get
		// the claim (the template itself is not mutated).
		deploy := `apiVersion: apps/v1
kind: Deployment
metadata:
  name: gpu-app
spec:
  replicas: 1
  selector:
    matchLabels: {app: gpu-app}
  template:
    metadata:
      labels: {app: gpu-app}
      annotations:
        gpu.example.com/count: "1"
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: app
        image: docker.io/library/busybox:1.35
        imagePullPolicy: Never
        command: ["sh", "-c", "sleep 600"]
`
		if out, err := c.KubectlStdin([]byte(deploy), "-n", ns, "apply", "-f", "-"); err != nil {
			t.Fatalf("apply annotated Deployment: %v\n%s", err, out)
		}
		c.Kubectl(t, "-n", ns, "rollout", "status", "deployment/gpu-app", "--timeout=2m")
		appPod := strings.TrimSpace(c.Kubectl(t, "-n", ns, "get", "pods", "-l", "app=gpu-app", "-o", "jsonpath={.items[0].metadata.name}"))
		if denv := c.GPUEnv(t, ns, appPod); len(denv) != 1 {
			t.Errorf("Deployment pod %s sees %q, want one GPU_DEVICE_<i> variable", appPod, denv)
		}
		if tmpl := c.Kubectl(t, "-n", ns, "get", "deployment", "gpu-app", "-o", "jsonpath={.spec.template.spec.resourceClaims}"); tmpl != "" {
			t.Errorf("the Deployment's pod template was mutated: %s", tmpl)
		}
		c.Kubectl(t, "-n", ns, "delete", "deployment", "gpu-app", "--wait=true")
	})

	t.Run("bad template is rejected with the field and the fix", func(t *testing.T) {
		ns := c.Namespace(t, "bad")
		data, err := os.ReadFile(filepath.Join("testdata", "seed", seedTemplate(version)))
		if err != nil {
			t.Fatal(err)
		}
		bad := strings.Replace(string(data), `"].model ==`, `"].modle ==`, 1)
		out, err := c.KubectlStdin([]byte(bad), "-n", ns, "apply", "-f", "-")
		if err == nil {
			t.Fatalf("template with .modle was admitted:\n%s", out)
		}
		for _, want := range []string{`unknown attribute "modle"`, "index", "model", "uuid", "driverVersion"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("rejection %q does not mention %q", err, want)
			}
		}
	})

	t.Run("uninstall leaves nothing behind", func(t *testing.T) {
		c.Helm(t, "uninstall", release, "-n", releaseNS, "--wait", "--timeout", "3m")
		installed = false
		framework.Eventually(t, time.Minute, "no ResourceSlice of "+driver, func() (bool, error) {
			out, err := c.KubectlErr("get", "resourceslices", "--field-selector", "spec.driver="+driver, "-o", "name")
			return strings.TrimSpace(out) == "", err
		})
		for _, kind := range []string{"validatingwebhookconfigurations", "mutatingwebhookconfigurations"} {
			if out := c.Kubectl(t, "get", kind, "-o", "name"); strings.Contains(out, release) {
				t.Errorf("%s left behind:\n%s", kind, out)
			}
		}
		secrets, err := c.Clientset.CoreV1().Secrets(releaseNS).List(context.Background(), metav1.ListOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		for _, s := range secrets.Items {
			if s.Type != corev1.SecretTypeServiceAccountToken {
				t.Errorf("secret %s/%s left behind", releaseNS, s.Name)
			}
		}
		if c.Local {
			if left := cdiFilesMatching(t, driver); len(left) > 0 {
				t.Errorf("CDI specs left behind: %v", left)
			}
		}
	})
}

// seedTemplate is the seed's template in the form the cluster serves: v1beta1 on 1.32, else v1.
func seedTemplate(version string) string {
	if version == "v1beta1" {
		return "resourceclaimtemplate.v1beta1.yaml"
	}
	return "resourceclaimtemplate.v1.yaml"
}

type sliceDevice struct {
	Name, UUID, Model, DriverVersion, Memory string
	Index                                    int
}

// driverDevices reads this driver's devices from every ResourceSlice in the served version's shape
// (v1beta1 wraps attributes in `basic`).
func driverDevices(c *framework.Cluster, version string) ([]sliceDevice, error) {
	out, err := c.KubectlErr("get", "resourceslices."+version+".resource.k8s.io", "--field-selector", "spec.driver="+driver, "-o", "json")
	if err != nil {
		return nil, err
	}
	type attr struct {
		Int     *int    `json:"int"`
		String  *string `json:"string"`
		Version *string `json:"version"`
	}
	type fields struct {
		Attributes map[string]attr `json:"attributes"`
		Capacity   map[string]struct {
			Value string `json:"value"`
		} `json:"capacity"`
	}
	var list struct {
		Items []struct {
			Spec struct {
				Devices []struct {
					Name  string  `json:"name"`
					Basic *fields `json:"basic"`
					fields
				} `json:"devices"`
			} `json:"spec"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, err
	}
	var devs []sliceDevice
	for _, it := range list.Items {
		for _, d := range it.Spec.Devices {
			f := d.fields
			if d.Basic != nil {
				f = *d.Basic
			}
			sd := sliceDevice{Name: d.Name, Memory: f.Capacity["memory"].Value}
			if a := f.Attributes["index"]; a.Int != nil {
				sd.Index = *a.Int
			}
			if a := f.Attributes["uuid"]; a.String != nil {
				sd.UUID = *a.String
			}
			if a := f.Attributes["model"]; a.String != nil {
				sd.Model = *a.String
			}
			if a := f.Attributes["driverVersion"]; a.Version != nil {
				sd.DriverVersion = *a.Version
			}
			devs = append(devs, sd)
		}
	}
	sort.Slice(devs, func(i, j int) bool { return devs[i].Index < devs[j].Index })
	return devs, nil
}

func claimUID(t *testing.T, c *framework.Cluster, ns string) string {
	t.Helper()
	return strings.TrimSpace(c.Kubectl(t, "-n", ns, "get", "resourceclaims", "-o", "jsonpath={.items[0].metadata.uid}"))
}

func waitClaimsGone(t *testing.T, c *framework.Cluster, ns string) {
	t.Helper()
	framework.Eventually(t, time.Minute, "the pod's ResourceClaim to be deleted with it", func() (bool, error) {
		out, err := c.KubectlErr("-n", ns, "get", "resourceclaims", "-o", "name")
		return strings.TrimSpace(out) == "", err
	})
}

// cdiFilesMatching lists CDI spec files on the node whose name or content mention s.
func cdiFilesMatching(t *testing.T, s string) []string {
	t.Helper()
	entries, err := os.ReadDir(cdiDir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		p := filepath.Join(cdiDir, e.Name())
		data, _ := os.ReadFile(p)
		if strings.Contains(e.Name(), s) || strings.Contains(string(data), s) {
			out = append(out, p)
		}
	}
	return out
}
