package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// Chaos run of the plugin: bounded in kills and time so that it fits `make test`.
const (
	chaosKills = 20
	// chaosGPUs is the node's inventory for the run: enough that pods waiting for the plugin do
	// not hold up the creation of new ones. While fewer than chaosLive pods live, a new one is
	// created every chaosEvery.
	chaosGPUs  = 16
	chaosLive  = 14
	chaosEvery = 1500 * time.Millisecond
	// chaosHold is how long a pod runs after it was seen running and checked.
	chaosHold = 2 * time.Second
	// chaosSettle is how long after the last kill every pod must be running. A pod whose prepare
	// found the plugin down is retried at the kubelet's next periodic sync of the pod (every
	// minute, jittered up to 1.5 minutes): the kubelet records no error for a failed prepare
	// (kuberuntime SyncPod), so there is no quicker back-off. While the plugin is still being
	// killed, a pod may be unlucky more than once.
	chaosSettle = 100 * time.Second
)

// TestPluginChaos SIGKILLs the plugin's process 20 times while pods with GPU claims are created
// and deleted at a steady rate. A pod that finds the plugin down waits (the kubelet retries its
// prepare) and must run in the end, with the GPU its claim was allocated. At no moment may a
// device be prepared for two claims (CDI specs and checkpoint), or a running pod's claim lack its
// CDI spec; when all pods are gone, no spec and no checkpoint entry may be left. Kills alternate
// between a restart in place (the kubelet restarts the container; only the first restart of a
// pod is immediate, later ones back off) and a replaced pod (killed and force-deleted, as after a
// node-level kill; the DaemonSet makes a new one).
func TestPluginChaos(t *testing.T) {
	c := framework.Setup(t)
	c.RequireLocal(t, "kills the plugin's process on the node and reads its CDI specs")
	began := time.Now()
	version := c.NewestResourceVersion(t)
	installRelease(t, c, version, "--set", fmt.Sprintf("inventory.defaults.count=%d", chaosGPUs))
	waitSlice(t, c, chaosGPUs)
	servingPlugin(t, c, time.Minute, nil)
	ns := c.Namespace(t, "chaos")
	c.Kubectl(t, "-n", ns, "apply", "-f", filepath.Join("testdata", "seed", seedTemplate(version)))

	k := &killer{c: c}
	killed := make(chan struct{})
	go func() { defer close(killed); k.run(chaosKills) }()

	w := &workload{c: c, ns: ns, claims: draclient.New(c.Clientset), pods: map[string]*chaosPod{}}
	var killsEnd time.Time
	for {
		if killsEnd.IsZero() {
			select {
			case <-killed:
				killsEnd = time.Now()
			default:
			}
		}
		w.step(killsEnd.IsZero())
		if !killsEnd.IsZero() && (w.settled() || time.Since(killsEnd) > chaosSettle) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	w.markLost(fmt.Sprintf("not running %s after the last kill", chaosSettle))
	<-killed

	// Every pod ran; now all of them go, and with them every prepared claim.
	w.deleteAll()
	framework.Eventually(t, 2*time.Minute, "the chaos pods and their claims to be gone", func() (bool, error) {
		pods, err := c.Clientset.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		claims, err := w.claims.ResourceClaims(ns).List(context.Background(), metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0 && len(claims.Items) == 0, err
	})
	retried := failedPrepares(t, c, ns)
	var left nodeState
	framework.Eventually(t, 30*time.Second, "no CDI spec or checkpoint entry left", func() (bool, error) {
		var err error
		left, err = nodeStateNow()
		return err == nil && len(left.specs) == 0 && len(left.entries) == 0, err
	})

	for _, e := range k.errs {
		t.Error(e)
	}
	for _, v := range w.violations {
		t.Error(v)
	}
	ran, lost := w.outcome()
	for _, p := range lost {
		t.Errorf("pod %s lost: %s", p.name, p.lost)
	}
	inPlace, replaced, maxRecovery, medianRecovery := k.figures()
	t.Logf("CHAOS plugin: %d SIGKILLs (%d restarted in place, %d pods replaced), %d pods created, %d ran with their GPU, %d lost, %d prepares refused while the plugin was down and retried; "+
		"%d devices prepared twice, %d CDI specs missing for running pods, %d specs and %d checkpoint entries left; "+
		"plugin serving again after max %.1fs, median %.1fs; pod start max %.1fs; %.0fs in all",
		inPlace+replaced, inPlace, replaced, len(w.pods), ran, len(lost), retried,
		w.doubles, w.missing, len(left.specs), len(left.entries),
		maxRecovery.Seconds(), medianRecovery.Seconds(), w.maxStart.Seconds(), time.Since(began).Seconds())
}

// failedPrepares counts the kubelet's FailedPrepareDynamicResources events in ns: prepares that
// found the plugin down and were retried.
func failedPrepares(t *testing.T, c *framework.Cluster, ns string) int {
	t.Helper()
	events, err := c.Clientset.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "reason=FailedPrepareDynamicResources"})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range events.Items {
		n += int(max(e.Count, 1))
	}
	return n
}

// killer SIGKILLs the serving plugin, waits until a plugin serves again and records how long that
// took. It runs beside the test's goroutine, so it records errors instead of failing the test.
type killer struct {
	c          *framework.Cluster
	mu         sync.Mutex
	recoveries []time.Duration
	inPlace    int
	errs       []error
}

func (k *killer) run(kills int) {
	for i := range kills {
		time.Sleep(500*time.Millisecond + rand.N(time.Second))
		if err := k.kill(); err != nil {
			k.mu.Lock()
			k.errs = append(k.errs, fmt.Errorf("kill %d: %w", i+1, err))
			k.mu.Unlock()
			return
		}
	}
}

func (k *killer) kill() error {
	ctx := context.Background()
	old, err := findServingPlugin(k.c, nil)
	if err != nil || old == nil {
		return fmt.Errorf("no serving plugin before the kill: %v", err)
	}
	restarts := old.Status.ContainerStatuses[0].RestartCount
	// The kubelet restarts a container at once only the first time; after that it backs off
	// (10 s, 20 s, ...), so a pod that was restarted already is replaced instead.
	inPlace := restarts == 0
	start := time.Now()
	if err := k.c.KillContainer(releaseNS, old.Name, "plugin"); err != nil {
		return err
	}
	if !inPlace {
		if err := k.c.Clientset.CoreV1().Pods(releaseNS).Delete(ctx, old.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			return fmt.Errorf("force-delete plugin pod %s: %w", old.Name, err)
		}
	}
	back := func(p *corev1.Pod) bool {
		if inPlace {
			return p.UID == old.UID && p.Status.ContainerStatuses[0].RestartCount > restarts
		}
		return p.UID != old.UID
	}
	for time.Since(start) < time.Minute {
		if p, _ := findServingPlugin(k.c, back); p != nil {
			k.mu.Lock()
			defer k.mu.Unlock()
			k.recoveries = append(k.recoveries, time.Since(start))
			if inPlace {
				k.inPlace++
			}
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("no plugin serving a minute after SIGKILL of %s (in place: %v)", old.Name, inPlace)
}

func (k *killer) figures() (inPlace, replaced int, maxRecovery, median time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	r := slices.Clone(k.recoveries)
	slices.Sort(r)
	if len(r) > 0 {
		maxRecovery, median = r[len(r)-1], r[len(r)/2]
	}
	return k.inPlace, len(r) - k.inPlace, maxRecovery, median
}

// workload creates pods with a GPU claim from the seed's template, checks each once it runs and
// deletes it a little later, and checks the node's prepared state on every step.
type workload struct {
	c      *framework.Cluster
	ns     string
	claims *draclient.Client

	pods        map[string]*chaosPod
	lastCreate  time.Time
	maxStart    time.Duration
	doubles     int
	missing     int
	violations  []string
	seenViolate map[string]bool
}

type chaosPod struct {
	name    string
	created time.Time
	// ran is when the pod was seen running with its GPU; claim is its claim then.
	ran     time.Time
	claim   types.UID
	deleted bool
	lost    string
}

func (w *workload) violate(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if w.seenViolate == nil {
		w.seenViolate = map[string]bool{}
	}
	if !w.seenViolate[msg] {
		w.seenViolate[msg] = true
		w.violations = append(w.violations, msg)
	}
}

func (w *workload) live() int {
	n := 0
	for _, p := range w.pods {
		if !p.deleted && p.lost == "" {
			n++
		}
	}
	return n
}

func (w *workload) step(creating bool) {
	ctx := context.Background()
	now := time.Now()
	if creating && w.live() < chaosLive && now.Sub(w.lastCreate) >= chaosEvery {
		name := fmt.Sprintf("chaos-%03d", len(w.pods))
		if out, err := w.c.KubectlStdin([]byte(framework.TemplatePod(name, "example")), "-n", w.ns, "apply", "-f", "-"); err != nil {
			w.violate("create pod %s: %v %s", name, err, out)
		} else {
			w.pods[name] = &chaosPod{name: name, created: now}
			w.lastCreate = now
		}
	}
	list, err := w.c.Clientset.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	state, stateErr := nodeStateNow()
	if stateErr != nil {
		w.violate("reading the node's prepared state: %v", stateErr)
	}
	for i := range list.Items {
		pod := &list.Items[i]
		p := w.pods[pod.Name]
		if p == nil || p.lost != "" || p.deleted {
			continue
		}
		switch {
		case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
			p.lost = fmt.Sprintf("phase %s: %s", pod.Status.Phase, pod.Status.Message)
		case p.ran.IsZero() && pod.Status.Phase == corev1.PodRunning:
			w.check(p, pod, state)
		case !p.ran.IsZero() && stateErr == nil:
			if _, ok := state.specs[p.claim]; !ok {
				w.missing++
				w.violate("running pod %s: the CDI spec of its claim %s is gone", p.name, p.claim)
			}
			if now.Sub(p.ran) >= chaosHold {
				w.delete(p)
			}
		}
		if p.lost != "" {
			w.delete(p)
		}
	}
	if stateErr == nil {
		if d := state.doublePrepared(); len(d) > 0 {
			w.doubles += len(d)
			w.violate("prepared for two claims at once: %v", d)
		}
	}
}

// check compares a running pod's GPU with its claim's allocation and its CDI spec.
func (w *workload) check(p *chaosPod, pod *corev1.Pod, state nodeState) {
	claim, err := claimOf(w.claims, pod)
	if err != nil {
		w.violate("running pod %s: %v", p.name, err)
		return
	}
	out, err := w.c.KubectlErr("-n", w.ns, "exec", p.name, "--", "env")
	if err != nil {
		return // not ready for exec yet; next step
	}
	var want []string
	for _, d := range claim.devices {
		_, dev, _ := strings.Cut(d, "/")
		want = append(want, "GPU_DEVICE_"+strings.TrimPrefix(dev, "gpu-")+"="+dev)
	}
	slices.Sort(want)
	if env := framework.GPUEnvOf(out); !slices.Equal(env, want) {
		w.violate("pod %s sees %q, its claim was allocated %v", p.name, env, claim.devices)
	}
	if spec, ok := state.specs[claim.uid]; !ok || !slices.Equal(spec.devices(), claim.devices) {
		w.violate("pod %s runs, its claim's CDI spec has %v (present: %v), allocated %v", p.name, spec.devices(), ok, claim.devices)
	}
	p.ran, p.claim = time.Now(), claim.uid
	if d := p.ran.Sub(p.created); d > w.maxStart {
		w.maxStart = d
	}
}

func (w *workload) delete(p *chaosPod) {
	p.deleted = true
	_ = w.c.Clientset.CoreV1().Pods(w.ns).Delete(context.Background(), p.name, metav1.DeleteOptions{})
}

// settled: no created pod is still waiting to run.
func (w *workload) settled() bool {
	for _, p := range w.pods {
		if p.ran.IsZero() && p.lost == "" {
			return false
		}
	}
	return true
}

// markLost gives up on the pods that are still waiting to run.
func (w *workload) markLost(why string) {
	for _, p := range w.pods {
		if p.ran.IsZero() && p.lost == "" {
			p.lost = why
		}
	}
}

func (w *workload) deleteAll() {
	for _, p := range w.pods {
		if !p.deleted {
			w.delete(p)
		}
	}
}

func (w *workload) outcome() (ran int, lost []*chaosPod) {
	for _, p := range w.pods {
		switch {
		case p.lost != "":
			lost = append(lost, p)
		case !p.ran.IsZero():
			ran++
		}
	}
	return ran, lost
}
