package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// Chaos run of the webhook and the API server: a fixed load, bounded in time, to fit `make test`.
const (
	// One annotated pod every chaosInputEvery (5 per second), whatever the answers take.
	chaosInputEvery = 200 * time.Millisecond
	// chaosBadEvery: every tenth input is one the webhook must refuse.
	chaosBadEvery = 10
	// Phase one: a webhook pod killed, deleted or force-deleted every webhookFaultEvery.
	webhookFaultsFor  = 40 * time.Second
	webhookFaultEvery = 4 * time.Second
	// Phase two: load for apiLoadBefore, the API server restarted, load until apiLoadAfter after
	// it is ready again.
	apiLoadBefore = 5 * time.Second
	apiLoadAfter  = 10 * time.Second
	// apiStopGrace is the restart's grace period: a kube-apiserver stops serving at SIGTERM but
	// then waits up to a minute for open connections to end.
	apiStopGrace = 10 * time.Second
	// chaosCreateTimeout bounds one create: longer means stuck (the webhook's own timeout is 5 s).
	chaosCreateTimeout = 30 * time.Second
	// chaosClaimWait is how long every admitted pod has, after the load, to get its claim from the
	// resourceclaim controller (proof that its template exists).
	chaosClaimWait = 90 * time.Second
)

// TestWebhookChaos creates annotated pods at a steady rate, a tenth of them with annotations the
// webhook must refuse, first while the webhook's pods are SIGKILLed, deleted and force-deleted in
// turn (two replicas and a PodDisruptionBudget; failurePolicy Fail), then while the API server is
// restarted. Every create must end in one of: admitted with the GPU claim injected, refused by the
// webhook with its message, refused because the webhook could not be called ("failed calling
// webhook"), or refused because the API server was down. A pod admitted without its claim, a bad
// input admitted, a create that hangs or fails otherwise, or an admitted pod whose claim is never
// created (its template missing) is lost. The pods are never scheduled (a nodeSelector no node
// has): the run is about admission, not about GPUs.
func TestWebhookChaos(t *testing.T) {
	c := framework.Setup(t)
	c.RequireLocal(t, "kills the webhook's processes and restarts the API server on the node")
	began := time.Now()
	version := c.NewestResourceVersion(t)
	probe := filepath.Join("testdata", "seed", seedTemplate(version))
	installRelease(t, c, version)
	ns := c.Namespace(t, "webhook-chaos")
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := c.KubectlErr("-n", releaseNS, "logs", "-l", webhookSelector, "--tail=60", "--prefix")
			t.Logf("webhook logs:\n%s", logs)
		}
	})
	// A client of its own: client-go's default rate limit (5 per second) would queue the load.
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	load := &chaosLoad{pods: kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods(ns)}

	stop := load.start("webhook killed")
	faults := &webhookFaults{c: c}
	faults.run(webhookFaultsFor, webhookFaultEvery)
	stop()
	for _, err := range faults.errs {
		t.Error(err)
	}
	c.Kubectl(t, "-n", releaseNS, "rollout", "status", "deployment/"+release+"-webhook", "--timeout=3m")
	framework.Eventually(t, 2*time.Minute, "the webhook to answer again", func() (bool, error) {
		_, err := c.KubectlErr("apply", "--dry-run=server", "-f", probe)
		return err == nil, err
	})

	stop = load.start("API server restarted")
	time.Sleep(apiLoadBefore)
	apiStopped, apiDown, err := c.RestartAPIServer(apiStopGrace, 3*time.Minute)
	if err != nil {
		t.Fatalf("restart the API server: %v", err)
	}
	time.Sleep(apiLoadAfter)
	stop()

	lost, created, counts := load.verify(t)
	for _, l := range lost {
		t.Error(l)
	}
	t.Logf("CHAOS webhook: inputs tried %d, faults injected %d, pods created %d, pods lost %d; "+
		"faults: %s, 1 API server restart (old process gone after %.1fs, unreachable %.1fs); answers: %s; slowest create %.1fs; %.0fs in all",
		len(load.inputs), faults.total()+1, created, len(lost), faults.summary(), apiStopped.Seconds(), apiDown.Seconds(),
		counts, load.slowest().Seconds(), time.Since(began).Seconds())
}

// chaosLoad creates annotated pods at a steady rate and records how each create ended.
type chaosLoad struct {
	pods corev1client.PodInterface

	mu     sync.Mutex
	inputs []*chaosInput
}

type chaosInput struct {
	name, phase string
	// bad is what the webhook must refuse in it ("" for a good input); want is its denial.
	bad, want string
	err       error
	took      time.Duration
}

// start creates a pod every chaosInputEvery, each create in its own goroutine (open loop: a slow
// answer does not slow the load), until stop, which waits for the creates in flight.
func (l *chaosLoad) start(phase string) (stop func()) {
	done := make(chan struct{})
	var creates sync.WaitGroup
	ticker := time.NewTicker(chaosInputEvery)
	var loop sync.WaitGroup
	loop.Go(func() {
		defer ticker.Stop()
		for {
			select {
			case <-done:
				return
			case <-ticker.C:
			}
			l.mu.Lock()
			in := chaosPodInput(len(l.inputs), phase)
			l.inputs = append(l.inputs, in)
			l.mu.Unlock()
			creates.Go(func() { l.create(in) })
		}
	})
	return func() {
		close(done)
		loop.Wait()
		creates.Wait()
	}
}

func (l *chaosLoad) create(in *chaosInput) {
	pod := admissionChaosPod(in)
	ctx, cancel := context.WithTimeout(context.Background(), chaosCreateTimeout)
	defer cancel()
	start := time.Now()
	_, err := l.pods.Create(ctx, pod, metav1.CreateOptions{})
	l.mu.Lock()
	defer l.mu.Unlock()
	in.err, in.took = err, time.Since(start)
}

// chaosPodInput is the i-th input: a few distinct requests (so that templates are created under
// the faults too), and every chaosBadEvery-th one wrong in a way the webhook must refuse.
func chaosPodInput(i int, phase string) *chaosInput {
	in := &chaosInput{name: fmt.Sprintf("in-%04d", i), phase: phase}
	if i%chaosBadEvery == chaosBadEvery-1 {
		switch (i / chaosBadEvery) % 3 {
		case 0:
			in.bad, in.want = "count 0", "a pod asking for GPUs needs at least 1"
		case 1:
			in.bad, in.want = "unknown container", `no container "trainer" in this pod`
		case 2:
			in.bad, in.want = "model longer than any device publishes", "longer than 64 bytes, so no device can publish it"
		}
	}
	return in
}

func admissionChaosPod(in *chaosInput) *corev1.Pod {
	i, _ := strconv.Atoi(strings.TrimPrefix(in.name, "in-"))
	ann := map[string]string{driver + "/count": strconv.Itoa(1 + i%4)}
	if i%3 == 0 {
		ann[driver+"/model"] = "LATEST-GPU-MODEL"
	}
	if i%5 == 0 {
		ann[driver+"/memory"] = "40Gi"
	}
	switch in.bad {
	case "count 0":
		ann[driver+"/count"] = "0"
	case "unknown container":
		ann[driver+"/containers"] = "trainer"
	case "model longer than any device publishes":
		ann[driver+"/model"] = strings.Repeat("M", 80)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: in.name, Annotations: ann, Labels: map[string]string{"phase": strings.ReplaceAll(in.phase, " ", "-")}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			// No node has it: admission is under test, not scheduling.
			NodeSelector: map[string]string{"gpu-dra.e2e/never": "true"},
			Containers:   []corev1.Container{{Name: "app", Image: "docker.io/library/busybox:1.35", ImagePullPolicy: corev1.PullNever}},
		},
	}
}

// How a create ended.
const (
	answerAdmitted       = "admitted"
	answerDenied         = "denied by the webhook"
	answerWebhookDown    = "webhook not reachable"
	answerAPIServerDown  = "API server not reachable"
	answerStuckOrUnclear = "stuck or unclear"
)

func classify(err error) string {
	switch {
	case err == nil:
		return answerAdmitted
	case strings.Contains(err.Error(), `admission webhook "pods.`+driver+`" denied the request`):
		return answerDenied
	case strings.Contains(err.Error(), `failed calling webhook "pods.`+driver+`"`):
		return answerWebhookDown
	case errors.Is(err, context.DeadlineExceeded):
		return answerStuckOrUnclear
	case utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err), utilnet.IsProbableEOF(err), errors.Is(err, io.ErrUnexpectedEOF),
		apierrors.IsServiceUnavailable(err), apierrors.IsServerTimeout(err), apierrors.IsTooManyRequests(err):
		return answerAPIServerDown
	}
	return answerStuckOrUnclear
}

// verify checks every input against the pods the cluster holds; it returns the lost ones, how many
// pods exist and a summary of the answers.
func (l *chaosLoad) verify(t *testing.T) (lost []string, created int, counts string) {
	t.Helper()
	tally := map[string]int{}
	goodDenied := map[string]int{}
	var admitted []string
	pods := l.all(t)
	for _, in := range l.inputs {
		answer := classify(in.err)
		pod, exists := pods[in.name]
		if answer != answerAdmitted && exists {
			// The API server stored it although the client saw an error (the connection broke
			// after the write): judge the pod.
			tally["admitted although the client saw an error"]++
			answer = answerAdmitted
		}
		tally[answer]++
		if answer == answerDenied && in.bad == "" {
			goodDenied[in.err.Error()]++
		}
		switch {
		case answer == answerAdmitted && in.bad != "":
			lost = append(lost, fmt.Sprintf("%s (%s, %s) admitted", in.name, in.bad, in.phase))
		case answer == answerAdmitted:
			if why := notInjected(pod); why != "" {
				lost = append(lost, fmt.Sprintf("%s (%s) admitted %s", in.name, in.phase, why))
				continue
			}
			admitted = append(admitted, in.name)
		case answer == answerDenied && in.bad != "" && !strings.Contains(in.err.Error(), in.want):
			lost = append(lost, fmt.Sprintf("%s (%s, %s) denied for another reason: %v", in.name, in.bad, in.phase, in.err))
		case answer == answerStuckOrUnclear:
			lost = append(lost, fmt.Sprintf("%s (%s) create ended after %.1fs with: %v", in.name, in.phase, in.took.Seconds(), in.err))
		}
	}
	// Every admitted pod's claim is created from its template, or the pod would wait forever.
	var missing []string
	deadline := time.Now().Add(chaosClaimWait)
	for {
		missing = missing[:0]
		pods = l.all(t)
		for _, name := range admitted {
			if p := pods[name]; p == nil || len(p.Status.ResourceClaimStatuses) == 0 || ptr.Deref(p.Status.ResourceClaimStatuses[0].ResourceClaimName, "") == "" {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	for _, name := range missing {
		lost = append(lost, fmt.Sprintf("%s admitted, but its claim was not created within %s", name, chaosClaimWait))
	}
	for msg, n := range goodDenied {
		t.Logf("%d good inputs denied: %s", n, msg)
	}
	keys := make([]string, 0, len(tally))
	for k := range tally {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, tally[k]))
	}
	return lost, len(pods), strings.Join(parts, ", ")
}

func (l *chaosLoad) all(t *testing.T) map[string]*corev1.Pod {
	t.Helper()
	list, err := l.pods.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out
}

func (l *chaosLoad) slowest() time.Duration {
	var d time.Duration
	for _, in := range l.inputs {
		d = max(d, in.took)
	}
	return d
}

// notInjected says what an admitted pod lacks of the webhook's injection, "" if nothing.
func notInjected(pod *corev1.Pod) string {
	i := slices.IndexFunc(pod.Spec.ResourceClaims, func(rc corev1.PodResourceClaim) bool { return rc.Name == "gpu-dra" })
	if i < 0 || !strings.HasPrefix(ptr.Deref(pod.Spec.ResourceClaims[i].ResourceClaimTemplateName, ""), "gpu-dra-") {
		return "without the gpu-dra claim"
	}
	if !slices.ContainsFunc(pod.Spec.Containers[0].Resources.Claims, func(c corev1.ResourceClaim) bool { return c.Name == "gpu-dra" }) {
		return "with the claim but no container using it"
	}
	return ""
}

// webhookFaults takes webhook pods down in turn: SIGKILL of the process (the kubelet restarts the
// container; the pod stays in the Service until its readiness probe fails), graceful deletion, and
// force deletion (gone from the Service at once, the process killed after). It runs beside the
// load, so it records errors instead of failing the test.
type webhookFaults struct {
	c      *framework.Cluster
	counts [3]int
	errs   []error
}

var webhookFaultKinds = [3]string{"SIGKILL", "delete", "force-delete"}

func (f *webhookFaults) run(d, every time.Duration) {
	ctx := context.Background()
	end := time.Now().Add(d)
	for i := 0; time.Now().Before(end); i++ {
		time.Sleep(every)
		list, err := f.c.Clientset.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{LabelSelector: webhookSelector})
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("list webhook pods: %w", err))
			continue
		}
		var running []*corev1.Pod
		for j := range list.Items {
			if p := &list.Items[j]; p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && containerRunning(p, "webhook") {
				running = append(running, p)
			}
		}
		if len(running) == 0 {
			continue // both down already: the next fault waits for one to come back
		}
		sort.Slice(running, func(a, b int) bool { return running[a].Name < running[b].Name })
		pod := running[i%len(running)]
		kind := i % len(webhookFaultKinds)
		switch kind {
		case 0:
			err = f.c.KillContainer(releaseNS, pod.Name, "webhook")
		case 1:
			err = f.c.Clientset.CoreV1().Pods(releaseNS).Delete(ctx, pod.Name, metav1.DeleteOptions{})
		case 2:
			err = f.c.Clientset.CoreV1().Pods(releaseNS).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		}
		if errors.Is(err, framework.ErrNotRunning) {
			// The pod's status said running, the runtime says it is restarting: nothing to kill, and
			// no fault injected (the next round picks again).
			continue
		}
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s webhook pod %s: %w", webhookFaultKinds[kind], pod.Name, err))
			continue
		}
		f.counts[kind]++
	}
}

// containerRunning: the pod's status shows its container running (a pod stays Running while the
// kubelet restarts a killed container).
func containerRunning(p *corev1.Pod, name string) bool {
	for _, st := range p.Status.ContainerStatuses {
		if st.Name == name {
			return st.State.Running != nil
		}
	}
	return false
}

func (f *webhookFaults) total() int { return f.counts[0] + f.counts[1] + f.counts[2] }

func (f *webhookFaults) summary() string {
	parts := make([]string, len(webhookFaultKinds))
	for i, k := range webhookFaultKinds {
		parts[i] = fmt.Sprintf("%d %s", f.counts[i], k)
	}
	return strings.Join(parts, ", ") + " of a webhook pod"
}
