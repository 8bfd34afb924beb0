package clusterupgrade

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

var sprintf = fmt.Sprintf

// published is what the node's slices hold: devices, how many of them several claims may share,
// and how many consume shared counters (partitions and whole devices of a partitioned GPU).
type published struct{ devices, shared, consuming int }

var (
	exclusiveGPUs   = published{devices: 8}
	sharedGPUs      = published{devices: 8, shared: 8}
	partitionedGPUs = published{devices: 8 * (2 + 1), consuming: 8 * (2 + 1)}
)

// waitPublished waits until the driver's slices hold want.
func (s *newestScenario) waitPublished(t *testing.T, what string, want published, timeout time.Duration) {
	t.Helper()
	slices := draclient.New(s.c.Clientset).ResourceSlices()
	var got published
	framework.Eventually(t, max(timeout, time.Second), what+" published", func() (bool, error) {
		list, err := slices.List(context.Background(), metav1.ListOptions{FieldSelector: "spec.driver=" + framework.Driver})
		if err != nil {
			return false, err
		}
		got = count(list.Items)
		return got == want, fmt.Errorf("published %+v, want %+v", got, want)
	})
}

func count(items []resourceapi.ResourceSlice) published {
	var p published
	for _, sl := range items {
		for _, d := range sl.Spec.Devices {
			p.devices++
			if ptr.Deref(d.AllowMultipleAllocations, false) {
				p.shared++
			}
			if len(d.ConsumesCounters) > 0 {
				p.consuming++
			}
		}
	}
	return p
}

// logCount is how many lines of the pod's logs (all its containers, since it started) match
// the regular expression line; an unreadable log counts as none.
func (s *newestScenario) logCount(pod, line string) int {
	out, err := s.c.KubectlErr("-n", framework.ReleaseNS, "logs", pod, "--all-containers", "--tail=-1")
	if err != nil {
		return 0
	}
	return len(regexp.MustCompile(line).FindAllStringIndex(out, -1))
}

func (s *newestScenario) waitPluginLog(t *testing.T, line string, timeout time.Duration) {
	t.Helper()
	framework.Eventually(t, max(timeout, time.Second), "the plugin to log "+line, func() (bool, error) {
		return s.logCount(s.pluginPod(t).name, line) > 0, nil
	})
}

func (s *newestScenario) webhookPods(t *testing.T) []string {
	t.Helper()
	out := s.c.Kubectl(t, "-n", framework.ReleaseNS, "get", "pods", "-l", "app.kubernetes.io/component=webhook",
		"--field-selector=status.phase=Running", "-o", "jsonpath={.items[*].metadata.name}")
	pods := strings.Fields(out)
	if len(pods) == 0 {
		t.Fatal("no running webhook pod")
	}
	return pods
}

// releaseState is the chart's workloads: each pod with its containers and restart counts, and
// what a rollout would change (generations, ReplicaSets, ControllerRevisions).
type releaseState struct{ pods, rollout string }

func (s *newestScenario) releaseState(t *testing.T) releaseState {
	t.Helper()
	pods := s.c.Kubectl(t, "-n", framework.ReleaseNS, "get", "pods", "-l", "app.kubernetes.io/instance="+framework.Release, "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.metadata.uid}{range .status.containerStatuses[*]} {.containerID} restarts={.restartCount}{end}{"\n"}{end}`)
	rollout := s.c.Kubectl(t, "-n", framework.ReleaseNS, "get", "deployments,daemonsets", "-o",
		`jsonpath={range .items[*]}{.kind}/{.metadata.name} generation={.metadata.generation}{"\n"}{end}`)
	rollout += s.c.Kubectl(t, "-n", framework.ReleaseNS, "get", "replicasets,controllerrevisions", "-o", "name")
	lines := strings.Split(strings.TrimSpace(pods), "\n")
	sort.Strings(lines)
	return releaseState{pods: strings.Join(lines, "\n"), rollout: rollout}
}

// sameRelease: no pod of the chart was replaced or restarted, and nothing rolled out.
func (s *newestScenario) sameRelease(t *testing.T) {
	t.Helper()
	now := s.releaseState(t)
	if now.pods != s.release.pods {
		t.Errorf("the chart's pods were replaced or restarted:\nbefore:\n%s\nnow:\n%s", s.release.pods, now.pods)
	}
	s.sameRollout(t)
}

func (s *newestScenario) sameRollout(t *testing.T) {
	t.Helper()
	if now := s.releaseState(t); now.rollout != s.release.rollout {
		t.Errorf("the chart's workloads rolled out (a helm upgrade or a spec change):\nbefore:\n%s\nnow:\n%s", s.release.rollout, now.rollout)
	}
}

// kubectlDra runs the project's kubectl plugin against the cluster and returns its output and
// exit code.
func (s *newestScenario) kubectlDra(t *testing.T, args ...string) (string, int) {
	t.Helper()
	if _, err := os.Stat(kubectlDra); err != nil {
		t.Fatalf("%v: `make e2e-upgrade-newest` builds it (make images)", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubectlDra, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+s.c.Kubeconfig)
	out, err := cmd.CombinedOutput()
	t.Logf("kubectl dra %s:\n%s", strings.Join(args, " "), out)
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	}
	t.Fatalf("kubectl dra %s: %v", strings.Join(args, " "), err)
	return "", 0
}

// wantSafe checks what kubectl dra preflight said (checkVerdict).
func wantSafe(t *testing.T, what, out string, code int, safe bool) {
	t.Helper()
	if err := checkVerdict(out, code, safe); err != nil {
		t.Errorf("%s: %v:\n%s", what, err, out)
	}
}

// checkVerdict compares kubectl dra preflight's exit status (0 safe, non-zero otherwise) and its
// verdict, the first line ("Upgrade to Kubernetes 1.38: SAFE" or "NOT SAFE"), with safe.
func checkVerdict(out string, code int, safe bool) error {
	verdict, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(out)), "\n")
	notSafe := strings.Contains(verdict, "not safe")
	switch {
	case safe && (code != 0 || notSafe || !strings.Contains(verdict, "safe")):
		return fmt.Errorf("exit %d, verdict %q; want 0 and safe", code, verdict)
	case !safe && (code == 0 || !notSafe):
		return fmt.Errorf("exit %d, verdict %q; want non-zero and not safe", code, verdict)
	}
	return nil
}

func (s *newestScenario) preflightBefore(t *testing.T) {
	stale := s.staleObjects(t)
	if len(stale) == 0 {
		t.Fatal("nothing is stored in an older version before the migration: the scenario proves nothing (objects written on the seed's release should be v1beta2)")
	}
	t.Logf("%d objects stored in an older version before the migration, e.g. %s", len(stale), stale[0])
	out, code := s.kubectlDra(t, "preflight", "--to", "1.38")
	wantSafe(t, "preflight --to 1.38 before the migration", out, code, false)
	// Offline files: the seed's v1beta1 template is what 1.38 refuses, whatever the cluster holds.
	out, code = s.kubectlDra(t, "preflight", "--to", "1.38", "-f", filepath.Join(seedDir, "resourceclaimtemplate.v1beta1.yaml"))
	wantSafe(t, "preflight --to 1.38 -f the seed's v1beta1 template", out, code, false)
	if !strings.Contains(out, "kubectl dra upgrade") {
		t.Errorf("preflight of a v1beta1 manifest does not give the kubectl dra upgrade line that fixes it:\n%s", out)
	}
}

// migrateByRewrite is what a cluster without the StorageVersionMigration API (1.35 and 1.36 by
// default) gets: kubectl dra migrate rewrites each object itself. Nothing the API server keeps
// says so but the record the command leaves, from which preflight now says safe.
func (s *newestScenario) migrateByRewrite(t *testing.T) {
	s.migrateWith(t, "--method", "rewrite")
	out, code := s.kubectlDra(t, "preflight", "--to", "1.38")
	wantSafe(t, "preflight --to 1.38 after kubectl dra migrate rewrote every object", out, code, true)
	if !strings.Contains(out, "rewritten by kubectl dra migrate on v"+newestRelease) {
		t.Errorf("preflight does not name the recorded rewrite:\n%s", out)
	}
}

func (s *newestScenario) migrate(t *testing.T) { s.migrateWith(t) }

func (s *newestScenario) migrateWith(t *testing.T, args ...string) {
	start := time.Now()
	out, code := s.kubectlDra(t, append([]string{"migrate"}, args...)...)
	if code != 0 {
		t.Fatalf("kubectl dra migrate %s: exit %d:\n%s", strings.Join(args, " "), code, out)
	}
	t.Logf("kubectl dra migrate %s took %s", strings.Join(args, " "), time.Since(start).Round(time.Second))
	if stale := s.staleObjects(t); len(stale) != 0 {
		t.Errorf("after kubectl dra migrate, etcd still holds %d objects in an older version:\n%s", len(stale), strings.Join(stale, "\n"))
	}
	s.stillRunning(t, s.keepers...)
}

func (s *newestScenario) preflightAfter(t *testing.T) {
	out, code := s.kubectlDra(t, "preflight", "--to", "1.38")
	wantSafe(t, "preflight --to 1.38 after the migration", out, code, true)
	out, code = s.kubectlDra(t, "preflight", "--to", "1.38", "-f", filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml"))
	wantSafe(t, "preflight --to 1.38 -f the seed's v1 template", out, code, true)
}

// staleObjects reads etcd itself: the API server converts every read, so only the raw keys tell
// in which version an object is stored.
func (s *newestScenario) staleObjects(t *testing.T) []string {
	t.Helper()
	stored, err := s.stored.StoredVersions(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	byVersion := map[string]int{}
	for _, v := range stored {
		byVersion[v]++
	}
	t.Logf("resource.k8s.io objects in etcd by stored version: %v", byVersion)
	return staleVersions(stored)
}

// staleVersions lists the keys (with their version) that the next releases cannot read: a
// DeviceClass, ResourceClaim, ResourceClaimTemplate or ResourceSlice stored in anything but v1
// (1.38 drops v1beta1, 1.39 v1beta2), and any object stored as v1beta1. (DeviceTaintRules are
// stored as v1beta2 by 1.37 itself.)
func staleVersions(stored map[string]string) []string {
	var out []string
	for key, v := range stored {
		current := strings.HasPrefix(key, "/registry/devicetaintrules/") && v != "resource.k8s.io/v1beta1"
		if v != "resource.k8s.io/v1" && !current {
			out = append(out, key+" ("+v+")")
		}
	}
	slices.Sort(out)
	return out
}
