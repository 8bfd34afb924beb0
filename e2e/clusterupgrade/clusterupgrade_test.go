// Package clusterupgrade replays the seed note as an upgrade: a 1.32 cluster with DRA beta and the
// product installed is upgraded in place, one minor at a time, to 1.34, and must keep giving pods
// GPUs throughout. It restarts the local cluster's control plane and kubelet, so it runs only from
// `make e2e-upgrade` (e2e/clusterupgrade.sh), which starts the cluster of the oldest release for it.
package clusterupgrade

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
	"github.com/gpu-dra/gpu-dra/hack/buildenv"
)

// The path of the seed note, one minor at a time as Kubernetes requires, with the API versions each
// step serves. The kubelet stays on 1.32 while the control plane moves (within the skew policy) and
// follows it to 1.34 after a drain; 1.32's kubelet reads claims through v1beta1, so v1beta1 stays
// served until then. The last step is the seed's 1.34 configuration: no extra flags, v1 only.
var (
	from = buildenv.Oldest
	via  = buildenv.UpgradeVia
	to   = buildenv.Seed
)

const (
	gate132   = "DynamicResourceAllocation=true"
	beta1     = "resource.k8s.io/v1beta1=true"
	beta1and2 = "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"
)

var (
	seedDir    = filepath.Join("..", "testdata", "seed")
	chartDir   = filepath.Join("..", "..", "charts", "gpu-dra")
	kubectlDra = filepath.Join("..", "..", "_output", "bin", "kubectl-dra")
)

type scenario struct {
	c      *framework.Cluster
	script string
	ns     string
	// Running through the control-plane upgrades, with the devices they got on 1.32.
	keepers []runningPod
	plugin  runningPod
}

// newScenario is the scenario on the local cluster that target (its make target) started, whose
// control plane and kubelet must both be of release; its pods go to a namespace named after prefix.
func newScenario(t *testing.T, release, prefix, target string) *scenario {
	t.Helper()
	c := framework.Setup(t)
	c.RequireLocal(t, "restarts the cluster's control plane and kubelet in place")
	s := &scenario{c: c, script: os.Getenv("GPU_DRA_UPGRADE_SCRIPT")}
	if s.script == "" {
		t.Fatalf("GPU_DRA_UPGRADE_SCRIPT is not set: run this scenario with `%s`", target)
	}
	if v := s.versions(t); v != "v"+release+"/v"+release {
		t.Fatalf("control plane/kubelet are %s, want v%s on both: `%s` starts that cluster", v, release, target)
	}
	s.ns = c.Namespace(t, prefix)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.KubectlErr("-n", framework.ReleaseNS, "get", "all,events", "-o", "wide")
			t.Logf("release namespace at failure:\n%s", out)
		}
	})
	return s
}

func TestSeedUpgrade(t *testing.T) {
	s := newScenario(t, from, "upgrade", "make e2e-upgrade")
	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"1.32: install and run GPU pods the 1.32 way", s.on132},
		{"upgrade control plane to 1.33, kubelet stays 1.32", s.to133},
		{"upgrade control plane to 1.34 keeping v1beta1, kubelet stays 1.32", s.to134},
		{"1.34: objects are v1, webhook judges v1 and warns on v1beta1", s.servedAsV1},
		{"1.34: kubectl dra upgrade of the 1.32 manifest applies", s.kubectlDraUpgrade},
		{"1.34: helm upgrade re-renders the DeviceClass as v1, claims untouched", s.helmUpgrade},
		{"drain and upgrade the kubelet to 1.34", s.kubeletTo134},
		{"1.34 as the seed configures it: v1 only", s.v1Only},
	}
	for _, st := range steps {
		if !t.Run(st.name, st.run) {
			t.FailNow()
		}
	}
}

func (s *scenario) on132(t *testing.T) {
	if v := s.c.NewestResourceVersion(t); v != "v1beta1" {
		t.Fatalf("1.32 with the seed's flags serves %s, want v1beta1 only", v)
	}
	s.c.InstallChart(t, chartDir, filepath.Join(seedDir, "resourceclaimtemplate.v1beta1.yaml"))
	if out := s.c.Helm(t, "get", "manifest", framework.Release, "-n", framework.ReleaseNS); !strings.Contains(out, "apiVersion: resource.k8s.io/v1beta1\nkind: DeviceClass") {
		t.Errorf("on 1.32 the chart should render the DeviceClass as v1beta1:\n%s", out)
	}
	s.plugin = s.pluginPod(t)

	// The seed's own template and pod, unchanged.
	s.c.Kubectl(t, "-n", s.ns, "apply", "-f", filepath.Join(seedDir, "resourceclaimtemplate.v1beta1.yaml"))
	s.c.Kubectl(t, "-n", s.ns, "apply", "-f", filepath.Join(seedDir, "pod.yaml"))
	s.c.WaitForPodPhase(t, s.ns, "example-claim", 3*time.Minute, "Running", "Succeeded")
	s.stopPod(t, "example-claim")

	// What must survive the control-plane upgrades: a pod from the seed's template, an annotated
	// pod, and a pod sharing a standalone v1beta1 claim.
	s.c.Kubectl(t, "-n", s.ns, "apply", "-f", filepath.Join("testdata", "standalone-claim.v1beta1.yaml"))
	s.keepers = []runningPod{
		s.startPod(t, framework.TemplatePod("keep-template", "example"), 1),
		s.startPod(t, framework.AnnotatedPod("keep-annotated", 2), 2),
		s.startPod(t, framework.ClaimPod("keep-standalone", "standalone"), 1),
	}
}

func (s *scenario) to133(t *testing.T) {
	s.controlPlaneTo(t, via, "RUNTIME_CONFIG="+beta1and2, "FEATURE_GATES="+gate132)
}

func (s *scenario) to134(t *testing.T) {
	s.controlPlaneTo(t, to, "RUNTIME_CONFIG="+beta1, "FEATURE_GATES=")
	s.startPod(t, framework.AnnotatedPod("new-annotated-on-134", 2), 2)
	s.stopPod(t, "new-annotated-on-134")
}

// controlPlaneTo upgrades the control plane under the running pods, which must keep their devices,
// and has the plugin, not restarted, prepare a new claim from the template written on 1.32.
func (s *scenario) controlPlaneTo(t *testing.T, version string, env ...string) {
	s.upgrade(t, "controlplane", version, env...)
	if v := s.versions(t); v != "v"+version+"/v"+from {
		t.Fatalf("control plane/kubelet are %s, want v%s/v%s", v, version, from)
	}
	s.stillRunning(t, s.keepers...)
	s.samePlugin(t)
	pod := "new-on-" + version
	s.startPod(t, framework.TemplatePod(pod, "example"), 1)
	s.stopPod(t, pod)
}

func (s *scenario) servedAsV1(t *testing.T) {
	// The template written in v1beta1 on 1.32 now reads as v1, with `exactly`.
	out := s.c.Kubectl(t, "-n", s.ns, "get", "resourceclaimtemplate", "example", "-o", "yaml")
	for _, want := range []string{"apiVersion: resource.k8s.io/v1\n", "exactly:", "deviceClassName: gpu.example.com"} {
		if !strings.Contains(out, want) {
			t.Errorf("template created on 1.32 read on 1.34 lacks %q:\n%s", want, out)
		}
	}
	// So do the webhook's managed templates.
	managed := s.c.Kubectl(t, "-n", s.ns, "get", "resourceclaimtemplates", "-l", "app.kubernetes.io/managed-by=gpu-dra", "-o", "yaml")
	if !strings.Contains(managed, "apiVersion: resource.k8s.io/v1\n") || !strings.Contains(managed, "exactly:") {
		t.Errorf("managed templates are not served as v1 with exactly:\n%s", managed)
	}
	// v1 requests are judged: the seed's template with a typo is rejected. (New names: an apply
	// to the existing "example" would be an update of an immutable spec, or no request at all.)
	bad := strings.Replace(seedTemplate(t, "v1", "example-typo"), `"].model ==`, `"].modle ==`, 1)
	if out, err := s.c.KubectlStdin([]byte(bad), "-n", s.ns, "apply", "--dry-run=server", "-f", "-"); err == nil ||
		!strings.Contains(err.Error(), `unknown attribute "modle"`) {
		t.Errorf("v1 template with .modle: want a denial naming the attribute, got %v\n%s", err, out)
	}
	// v1beta1 requests are admitted with a warning that gives the v1 form.
	_, warnings := s.c.KubectlWarnings(t, []byte(seedTemplate(t, "v1beta1", "example-beta")), "-n", s.ns, "apply", "--dry-run=server", "-f", "-")
	// (The API server adds its own deprecation warning; this is the webhook's.)
	if !strings.Contains(warnings, "is deprecated and removed in Kubernetes 1.38; write it as resource.k8s.io/v1") || !strings.Contains(warnings, "exactly") {
		t.Errorf("v1beta1 template on 1.34: want the deprecation warning with the v1 form, got %q", warnings)
	}
}

// seedTemplate is the seed's ResourceClaimTemplate in one of its two forms, renamed.
func seedTemplate(t *testing.T, version, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(seedDir, "resourceclaimtemplate."+version+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	renamed := strings.Replace(string(data), "\n  name: example\n", "\n  name: "+name+"\n", 1)
	if renamed == string(data) {
		t.Fatalf("seed template %s has no metadata.name example", version)
	}
	return renamed
}

func (s *scenario) kubectlDraUpgrade(t *testing.T) {
	if _, err := os.Stat(kubectlDra); err != nil {
		t.Fatalf("%v: `make e2e-upgrade` builds it (make images)", err)
	}
	// No --to: the plugin asks the cluster (KUBECONFIG) for the newest version it serves.
	cmd := exec.CommandContext(t.Context(), kubectlDra, "upgrade", "-f", filepath.Join(seedDir, "resourceclaimtemplate.v1beta1.yaml"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl dra upgrade: %v\n%s", err, stderr.String())
	}
	out := string(raw)
	upgraded := strings.Replace(out, "name: example", "name: example-upgraded", 1)
	if !strings.Contains(upgraded, "apiVersion: resource.k8s.io/v1\n") {
		t.Fatalf("kubectl dra upgrade did not produce v1:\n%s", out)
	}
	if _, warnings := s.c.KubectlWarnings(t, []byte(upgraded), "-n", s.ns, "apply", "-f", "-"); strings.Contains(warnings, "deprecated") {
		t.Errorf("the upgraded manifest still draws a deprecation warning: %s", warnings)
	}
	s.startPod(t, framework.TemplatePod("from-upgraded-manifest", "example-upgraded"), 1)
	s.stopPod(t, "from-upgraded-manifest")
}

func (s *scenario) helmUpgrade(t *testing.T) {
	classUID := s.c.Kubectl(t, "get", "deviceclass", framework.Driver, "-o", "jsonpath={.metadata.uid}")
	s.c.InstallChart(t, chartDir, filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml"))
	if out := s.c.Helm(t, "get", "manifest", framework.Release, "-n", framework.ReleaseNS); !strings.Contains(out, "apiVersion: resource.k8s.io/v1\nkind: DeviceClass") {
		t.Errorf("after the cluster upgrade, helm upgrade should render the DeviceClass as v1:\n%s", out)
	}
	if now := s.c.Kubectl(t, "get", "deviceclass", framework.Driver, "-o", "jsonpath={.metadata.uid}"); now != classUID {
		t.Errorf("helm upgrade replaced the DeviceClass (uid %s -> %s) instead of updating it", classUID, now)
	}
	s.stillRunning(t, s.keepers...)
}

// kubeletTo drains the node, stopping the pods kept so far, upgrades the kubelet to version and
// waits for the webhook.
func (s *scenario) kubeletTo(t *testing.T, version string) {
	t.Helper()
	// Upstream does not support in-place minor kubelet upgrades: drain first. On one node the
	// webhook's PodDisruptionBudget cannot be met (its replicas have nowhere to go), so pods are
	// deleted rather than evicted.
	node := s.c.NodeName
	s.c.Kubectl(t, "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--disable-eviction", "--timeout=100s")
	for _, p := range s.keepers {
		s.stopPod(t, p.name)
	}
	s.keepers = nil
	s.upgrade(t, "kubelet", version)
	s.c.Kubectl(t, "uncordon", node)
	if v := s.versions(t); v != "v"+version+"/v"+version {
		t.Fatalf("control plane/kubelet are %s, want v%s on both", v, version)
	}
	s.waitWebhook(t)
	// Drain leaves the DaemonSet's plugin running; the new kubelet finds its sockets. Whether the
	// new kubelet restarted the container (its spec hash may differ between minors) is reported,
	// not required: in-place kubelet upgrades are outside upstream's support.
	if now := s.pluginPod(t); now.containerID != s.plugin.containerID {
		t.Logf("the v%s kubelet restarted the plugin's container (%s -> %s)", version, s.plugin.containerID, now.containerID)
	} else {
		t.Logf("the plugin's container kept running across the kubelet upgrade")
	}
}

func (s *scenario) kubeletTo134(t *testing.T) {
	s.kubeletTo(t, to)
	s.waitDevices(t, 8)
	s.startPod(t, framework.ClaimPod("standalone-after-kubelet", "standalone"), 1)
	s.stopPod(t, "standalone-after-kubelet")
	// A restarted plugin prepares too (it deletes its slices on SIGTERM and publishes them again).
	old := s.pluginPod(t)
	s.c.Kubectl(t, "-n", framework.ReleaseNS, "delete", "pod", old.name, "--wait=true")
	framework.Eventually(t, 3*time.Minute, "a new kubelet plugin pod", func() (bool, error) {
		out, err := s.c.KubectlErr("-n", framework.ReleaseNS, "get", "pods", "-l", "app.kubernetes.io/component=kubelet-plugin",
			"-o", `jsonpath={range .items[*]}{.metadata.uid} {.status.containerStatuses[0].ready}{"\n"}{end}`)
		f := strings.Fields(out)
		return len(f) == 2 && f[0] != string(old.uid) && f[1] == "true", err
	})
	s.plugin = s.pluginPod(t)
	s.waitDevices(t, 8)
	s.keepers = []runningPod{
		s.startPod(t, framework.TemplatePod("template-after-restart", "example"), 1),
		s.startPod(t, framework.AnnotatedPod("annotated-after-restart", 2), 2),
	}
}

func (s *scenario) v1Only(t *testing.T) {
	s.upgrade(t, "controlplane", to, "RUNTIME_CONFIG=", "FEATURE_GATES=")
	if v := s.c.NewestResourceVersion(t); v != "v1" {
		t.Fatalf("newest served version %s, want v1", v)
	}
	if out := s.c.Kubectl(t, "api-versions"); strings.Contains(out, "resource.k8s.io/v1beta") {
		t.Fatalf("v1beta1/v1beta2 still served:\n%s", out)
	}
	s.stillRunning(t, s.keepers...)
	s.waitWebhook(t)
	s.waitDevices(t, 8)
	s.samePlugin(t)
	s.startPod(t, framework.AnnotatedPod("annotated-v1-only", 1), 1)
	s.startPod(t, framework.TemplatePod("template-v1-only", "example"), 1)
	// The release can still be upgraded once v1beta1 is gone.
	s.c.InstallChart(t, chartDir, filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml"))
	s.stillRunning(t, s.keepers...)
}

// upgrade runs the harness's in-place upgrade of one part (e2e/cluster/upgrade.sh).
func (s *scenario) upgrade(t *testing.T, part, version string, env ...string) {
	t.Helper()
	start := time.Now()
	cmd := exec.CommandContext(t.Context(), s.script, part, version)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	t.Logf("upgrade.sh %s %s (%s) took %s:\n%s", part, version, strings.Join(env, " "), time.Since(start).Round(time.Second), out)
	if err != nil {
		t.Fatalf("upgrade.sh %s %s: %v", part, version, err)
	}
	s.waitWebhook(t)
}

// versions is "<apiserver>/<kubelet>".
func (s *scenario) versions(t *testing.T) string {
	t.Helper()
	server, err := s.c.Clientset.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	kubelet := s.c.Kubectl(t, "get", "node", s.c.NodeName, "-o", "jsonpath={.status.nodeInfo.kubeletVersion}")
	return server.GitVersion + "/" + kubelet
}

// waitWebhook waits until the API server reaches the webhook again after a restart.
func (s *scenario) waitWebhook(t *testing.T) {
	t.Helper()
	// The seed's template in a version the server serves: v1 from 1.34, v1beta1 before.
	probe := filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml")
	if s.c.NewestResourceVersion(t) != "v1" {
		probe = filepath.Join(seedDir, "resourceclaimtemplate.v1beta1.yaml")
	}
	framework.Eventually(t, 3*time.Minute, "the webhook to answer the API server", func() (bool, error) {
		_, err := s.c.KubectlErr("-n", s.ns, "apply", "--dry-run=server", "-f", probe)
		return err == nil, err
	})
}

func (s *scenario) samePlugin(t *testing.T) {
	t.Helper()
	if now := s.pluginPod(t); now.uid != s.plugin.uid || now.containerID != s.plugin.containerID {
		t.Errorf("kubelet plugin was restarted: %+v -> %+v", s.plugin, now)
	}
}

func (s *scenario) waitDevices(t *testing.T, n int) {
	t.Helper()
	framework.Eventually(t, 2*time.Minute, "the node's ResourceSlice with its GPUs", func() (bool, error) {
		out, err := s.c.KubectlErr("get", "resourceslices", "--field-selector", "spec.driver="+framework.Driver,
			"-o", "jsonpath={.items[*].spec.devices[*].name}")
		return len(strings.Fields(out)) == n, err
	})
}
