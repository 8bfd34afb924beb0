package clusterupgrade

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/version"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
	"github.com/gpu-dra/gpu-dra/hack/buildenv"
)

// The path from the seed's release to the newest, the control plane one minor at a time, each
// release with its defaults. The kubelet stays on the seed's release until the control plane is
// on the newest (three minors apart, the kubelet's skew limit) and follows it last.
var (
	seedRelease   = buildenv.Seed
	newestRelease = buildenv.Newest
	groupLabel    = "gpu.example.com/group"
)

// servedFrom is the release whose defaults serve consumable capacity, partitionable devices,
// device taints and DRA extended resources (all beta and on in 1.36; pkg/features of each
// release).
var servedFrom = version.MajorMinor(1, 36)

// noticeBound is how soon after its control-plane step the plugin and the webhook must say they
// use what the API server now serves: they ask every 30s plus up to 20% jitter, and the plugin
// re-publishes at its next inventory tick (10s).
const noticeBound = 90 * time.Second

// webhookFeatures are the features each webhook replica says the API server now serves from
// 1.36: capacity requests (probed), and extended resources (read from the chart's class, whose
// dropped extendedResourceName the webhook restores).
var webhookFeatures = []string{"DRAConsumableCapacity", "DRAExtendedResource"}

// The lines the plugin and the webhook log once when the API server starts serving a feature, as
// regular expressions: the loggers' own keys (driver, node) come between message and feature.
const (
	pluginNowServes  = `"API server now serves a DRA feature; re-publishing" .*feature="%s"`
	taintsNowServed  = `"API server now serves a DRA feature; device taints are published from now on" .*feature="DRADeviceTaints"`
	webhookNowServes = `"The API server now serves a DRA feature" .*feature="%s"`
)

// newestScenario is the upgrade from the seed's release to the newest one.
type newestScenario struct {
	*scenario
	stored storedVersions
	// release is the chart's workloads as installed: nothing may restart or roll out while the
	// control plane is upgraded.
	release releaseState
	// noticed is when the plugin and webhook said the API server serves the features, once.
	noticed bool
}

func TestNewestUpgrade(t *testing.T) {
	s := &newestScenario{scenario: newScenario(t, seedRelease, "newest", "make e2e-upgrade-newest"), stored: localEtcd()}
	type step struct {
		name string
		run  func(t *testing.T)
	}
	steps := []step{{"v" + seedRelease + ": install with a shared-memory and a partitioned node group; both fall back", s.onSeed}}
	for _, v := range append(append([]string{}, buildenv.ToNewest...), newestRelease) {
		steps = append(steps, step{"upgrade the control plane to v" + v + ", kubelet stays v" + seedRelease, func(t *testing.T) { s.controlPlaneTo(t, v) }})
	}
	steps = append(steps,
		step{"drain and upgrade the kubelet to v" + newestRelease, s.kubeletToNewest},
		step{"v" + newestRelease + ": preflight --to 1.38 says not safe before the migration", s.preflightBefore},
		step{"v" + newestRelease + ": kubectl dra migrate --method rewrite leaves nothing stored as v1beta1 or v1beta2, and preflight knows", s.migrateByRewrite},
		step{"v" + newestRelease + ": kubectl dra migrate through StorageVersionMigrations finds the same", s.migrate},
		step{"v" + newestRelease + ": preflight --to 1.38 says safe after the migration", s.preflightAfter},
	)
	for _, st := range steps {
		if !t.Run(st.name, st.run) {
			t.FailNow()
		}
	}
}

func (s *newestScenario) onSeed(t *testing.T) {
	if v := s.c.NewestResourceVersion(t); v != "v1" {
		t.Fatalf("v%s serves resource.k8s.io/%s, want v1", seedRelease, v)
	}
	// The plugin starts in the partitioned group and is moved to the shared-memory one: both modes
	// are probed, and both fall back, before the upgrade.
	s.labelNode(t, "partitioned")
	s.c.InstallChart(t, chartDir, filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml"), "-f", filepath.Join("testdata", "newest-values.yaml"))
	s.waitPluginLog(t, `want="partitioned"`, time.Minute)
	s.labelNode(t, "shared")
	s.waitPluginLog(t, `want="shared-memory"`, time.Minute)
	s.waitPublished(t, "8 exclusive GPUs", exclusiveGPUs, 2*time.Minute)
	s.plugin = s.pluginPod(t)
	s.release = s.releaseState(t)

	s.seedPodRuns(t, "v1")
	s.c.Kubectl(t, "-n", s.ns, "apply", "-f", filepath.Join("testdata", "standalone-claim.v1.yaml"))
	s.keepers = []runningPod{
		s.startPod(t, framework.TemplatePod("keep-template", "example"), 1),
		s.startPod(t, framework.AnnotatedPod("keep-annotated", 2), 2),
		s.startPod(t, framework.ClaimPod("keep-standalone", "standalone"), 1),
		// resources.limits: a claim of the webhook's before 1.36 (and after: the chart's class
		// was written while the API server dropped its extendedResourceName).
		s.startPod(t, limitsPod(t, "keep-limits"), 2),
	}
}

// controlPlaneTo upgrades the control plane under the running pods, which keep their devices,
// and checks that the plugin and the webhook follow what the new release serves without a
// restart, a rollout or a helm upgrade.
func (s *newestScenario) controlPlaneTo(t *testing.T, v string) {
	s.upgrade(t, "controlplane", v, "RUNTIME_CONFIG=", "FEATURE_GATES=")
	upgraded := time.Now()
	if got := s.versions(t); got != "v"+v+"/v"+seedRelease {
		t.Fatalf("control plane/kubelet are %s, want v%s/v%s", got, v, seedRelease)
	}
	s.stillRunning(t, s.keepers...)
	served := version.MustParseGeneric(v).AtLeast(servedFrom)
	if served {
		s.noticeFeatures(t, upgraded)
	} else {
		s.notNoticed(t)
		s.waitPublished(t, "8 exclusive GPUs", exclusiveGPUs, 2*time.Minute)
	}
	s.samePlugin(t)
	s.sameRelease(t)

	pod := "new-on-" + strings.ReplaceAll(v, ".", "-")
	s.startPod(t, framework.TemplatePod(pod, "example"), 1)
	s.stopPod(t, pod)
	if served {
		s.shareRuns(t, "share-on-"+strings.ReplaceAll(v, ".", "-"))
	}
	s.seedPodRuns(t, "v1")
	s.stillRunning(t, s.keepers...)
}

// noticeFeatures: within noticeBound of the upgrade, the plugin re-published the node's GPUs as
// shared and said so once per feature, and each webhook replica said it serves consumable
// capacity once. At the first such step, the node is also moved to the partitioned group and
// back, which its plugin now publishes as partitions.
func (s *newestScenario) noticeFeatures(t *testing.T, since time.Time) {
	deadline := since.Add(noticeBound)
	s.waitPublished(t, "8 shared-memory GPUs", sharedGPUs, time.Until(deadline))
	for _, line := range []string{
		sprintf(pluginNowServes, "DRAConsumableCapacity"), sprintf(pluginNowServes, "DRAPartitionableDevices"), taintsNowServed,
	} {
		s.waitPluginLog(t, line, time.Until(deadline))
	}
	for _, pod := range s.webhookPods(t) {
		for _, f := range webhookFeatures {
			framework.Eventually(t, max(time.Until(deadline), time.Second), "webhook "+pod+" to say it serves "+f, func() (bool, error) {
				return s.logCount(pod, sprintf(webhookNowServes, f)) > 0, nil
			})
		}
	}
	// The chart's class was written on the seed's release, which dropped its extendedResourceName;
	// the webhook put it back once the API server kept it.
	if got := s.c.Kubectl(t, "get", "deviceclass", "gpu.example.com", "-o", "jsonpath={.spec.extendedResourceName}"); got != "gpu.example.com/gpu" {
		t.Errorf("DeviceClass gpu.example.com has extendedResourceName %q, want gpu.example.com/gpu restored", got)
	}
	t.Logf("the plugin and the webhook followed the new release %s after its control plane answered", time.Since(since).Round(time.Second))
	s.noticedOnce(t)
	if s.noticed {
		return
	}
	s.noticed = true
	s.labelNode(t, "partitioned")
	s.waitPublished(t, "8 GPUs as 2 partitions and a whole device each", partitionedGPUs, 2*time.Minute)
	s.labelNode(t, "shared")
	s.waitPublished(t, "8 shared-memory GPUs again", sharedGPUs, 2*time.Minute)
}

// noticedOnce: each change was logged once, however many re-probes followed.
func (s *newestScenario) noticedOnce(t *testing.T) {
	t.Helper()
	plugin := s.pluginPod(t).name
	for _, line := range []string{sprintf(pluginNowServes, "DRAConsumableCapacity"), sprintf(pluginNowServes, "DRAPartitionableDevices"), taintsNowServed} {
		if n := s.logCount(plugin, line); n != 1 {
			t.Errorf("plugin logged %s %d times, want once", line, n)
		}
	}
	for _, pod := range s.webhookPods(t) {
		for _, f := range webhookFeatures {
			if n := s.logCount(pod, sprintf(webhookNowServes, f)); n != 1 {
				t.Errorf("webhook %s logged that the API server now serves %s %d times, want once", pod, f, n)
			}
		}
	}
}

// notNoticed: before the release that serves them, nobody claims the features are served.
func (s *newestScenario) notNoticed(t *testing.T) {
	t.Helper()
	for _, pod := range append(s.webhookPods(t), s.pluginPod(t).name) {
		if n := s.logCount(pod, "now serves a DRA feature"); n != 0 {
			t.Errorf("%s says the API server now serves a feature before v%s", pod, servedFrom)
		}
	}
}

func (s *newestScenario) kubeletToNewest(t *testing.T) {
	s.kubeletTo(t, newestRelease)
	s.plugin = s.pluginPod(t)
	s.waitPublished(t, "8 shared-memory GPUs", sharedGPUs, 2*time.Minute)
	// The drain replaced the webhook's pods from the same ReplicaSet: no rollout.
	s.sameRollout(t)
	s.release = s.releaseState(t)
	s.seedPodRuns(t, "v1")
	limits := "limits-on-kubelet-" + strings.ReplaceAll(newestRelease, ".", "-")
	s.keepers = []runningPod{
		s.startPod(t, framework.TemplatePod("template-on-kubelet-"+strings.ReplaceAll(newestRelease, ".", "-"), "example"), 1),
		s.startPod(t, limitsPod(t, limits), 2),
	}
	// With every kubelet new enough, the webhook leaves resources.limits to the scheduler, which
	// makes the pod's claim itself.
	if got := s.c.Kubectl(t, "-n", s.ns, "get", "pod", limits, "-o", "jsonpath={.spec.resourceClaims[*].name}|{.status.extendedResourceClaimStatus.resourceClaimName}"); !strings.HasPrefix(got, "|") || got == "|" {
		t.Errorf("pod %s: webhook claims and the scheduler's claim %q; want only the scheduler's", limits, got)
	}
	s.shareRuns(t, "share-on-kubelet-"+strings.ReplaceAll(newestRelease, ".", "-"))
}

// shareRuns: the webhook turns a pod's memory annotation into a share of a GPU, now that the API
// server keeps capacity requests and the plugin publishes shared-memory GPUs. The webhook reads
// the published GPUs from its informers, whose watches reconnect with client-go's back-off (up to
// 30s) after the API server restarts; until they do it gives whole GPUs, which is safe. So a pod
// that got a whole GPU is replaced by another, within noticeBound, and the wait is logged.
func (s *newestScenario) shareRuns(t *testing.T, name string) {
	t.Helper()
	start := time.Now()
	share := regexp.MustCompile(`(?m)^GPU_DEVICE_[0-9]+_MEMORY=10Gi$`)
	for attempt := 1; ; attempt++ {
		pod := fmt.Sprintf("%s-%d", name, attempt)
		manifest := strings.Replace(framework.AnnotatedPod(pod, 1), "gpu.example.com/count: \"1\"\n",
			"gpu.example.com/count: \"1\"\n    gpu.example.com/memory: 10Gi\n", 1)
		if !strings.Contains(manifest, "gpu.example.com/memory") {
			t.Fatalf("annotated pod manifest changed shape:\n%s", manifest)
		}
		s.startPod(t, manifest, 1)
		env := s.c.Kubectl(t, "-n", s.ns, "exec", pod, "--", "env")
		s.stopPod(t, pod)
		if share.MatchString(env) {
			t.Logf("pod %s with memory: 10Gi got a 10Gi share %s after the first try (attempt %d)", pod, time.Since(start).Round(time.Second), attempt)
			return
		}
		if time.Since(start) > noticeBound {
			t.Errorf("pods with memory: 10Gi did not get a 10Gi share within %s; the last one, %s, sees:\n%s", noticeBound, pod, env)
			out, _ := s.c.KubectlErr("-n", s.ns, "get", "resourceclaimtemplates,resourceclaims", "-o", "yaml")
			t.Logf("templates and claims:\n%s", out)
			return
		}
		t.Logf("pod %s with memory: 10Gi got a whole GPU %s after the first try; trying again", pod, time.Since(start).Round(time.Second))
		time.Sleep(5 * time.Second)
	}
}

// seedPodRuns runs the seed's own pod from its own template (in version v) and removes it.
func (s *newestScenario) seedPodRuns(t *testing.T, v string) {
	t.Helper()
	s.c.Kubectl(t, "-n", s.ns, "apply", "-f", filepath.Join(seedDir, "resourceclaimtemplate."+v+".yaml"))
	s.c.Kubectl(t, "-n", s.ns, "apply", "-f", filepath.Join(seedDir, "pod.yaml"))
	s.c.WaitForPodPhase(t, s.ns, "example-claim", 3*time.Minute, "Running", "Succeeded")
	s.stopPod(t, "example-claim")
}

func (s *newestScenario) labelNode(t *testing.T, group string) {
	t.Helper()
	s.c.Kubectl(t, "label", "node", s.c.NodeName, "--overwrite", groupLabel+"="+group)
}

// limitsPod is the extended-resource suite's pod (two GPUs in resources.limits), renamed.
func limitsPod(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "testdata", "extended", "pod-limits.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	renamed := strings.Replace(string(data), "\n  name: two-gpus\n", "\n  name: "+name+"\n", 1)
	if renamed == string(data) {
		t.Fatal("pod-limits.yaml has no metadata.name two-gpus")
	}
	// startPod takes the first "name:" as the pod's; comments before it must not hold one.
	return renamed[strings.Index(renamed, "apiVersion:"):]
}
