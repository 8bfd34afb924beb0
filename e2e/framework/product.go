package framework

import (
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra/hack/buildenv"
)

// The product as the chart installs it.
const (
	Release   = "gpu-dra"
	ReleaseNS = "gpu-dra"
	Driver    = "gpu.example.com"
)

// Helm runs the helm CLI against the cluster and fails the test on error.
func (c *Cluster) Helm(t *testing.T, args ...string) string {
	t.Helper()
	out, err := Run(t, 6*time.Minute, "helm", append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// InstallChart installs (or upgrades) the chart in chartDir with the image under test
// (buildenv.Image: $PROJECT_IMAGE, default the locally built one), waits for its pods, and then until the API server gets answers from
// the webhook: Ready pods are not yet a serving webhook (the Service's proxy rules and, in self mode,
// the caBundle follow within seconds). probe is a manifest the webhook admits, applied with
// --dry-run=server.
func (c *Cluster) InstallChart(t *testing.T, chartDir, probe string, extraArgs ...string) {
	t.Helper()
	repo, tag := buildenv.Image()
	args := []string{"upgrade", "--install", Release, chartDir, "-n", ReleaseNS, "--create-namespace", "--wait", "--timeout", "5m",
		"--set", "image.repository=" + repo, "--set", "image.tag=" + tag, "--set", "image.pullPolicy=Never"}
	c.Helm(t, append(args, extraArgs...)...)
	Eventually(t, time.Minute, "the webhook to answer the API server", func() (bool, error) {
		_, err := c.KubectlErr("apply", "--dry-run=server", "-f", probe)
		return err == nil, err
	})
}

var gpuEnv = regexp.MustCompile(`^GPU_DEVICE_[0-9]+=`)

// GPUEnv is the GPU_DEVICE_<i>=gpu-<i> lines a pod's first container sees, sorted.
func (c *Cluster) GPUEnv(t *testing.T, ns, pod string) []string {
	t.Helper()
	return GPUEnvOf(c.Kubectl(t, "-n", ns, "exec", pod, "--", "env"))
}

// GPUEnvOf picks the GPU_DEVICE_<i>=gpu-<i> lines out of env's output, sorted.
func GPUEnvOf(env string) []string {
	var out []string
	for _, kv := range strings.Split(env, "\n") {
		if gpuEnv.MatchString(kv) {
			out = append(out, strings.TrimSpace(kv))
		}
	}
	sort.Strings(out)
	return out
}
