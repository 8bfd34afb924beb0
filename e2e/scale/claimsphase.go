package scale

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// claimsResult is the largest fleet with the held claims in place.
type claimsResult struct {
	Claims, Devices int
	Written         time.Duration
	// Mem is the registered webhook once it took the claims in; Fresh one started with them
	// (the run's GOGC and GOMEMLIMIT), Restart one started with them as the chart runs it (its
	// GOGC, GOMEMLIMIT at its memory limit), whose peak is what the limit must allow.
	Mem, Fresh, Restart memory
	Limit               int64
	// Templates and Pods are the loads straight to the webhook at each of ClaimsRates, against
	// the baseline's.
	Templates, Pods []*comparison
	Churn           *churnResult
	CLI             *cliTimes
}

// churnResult is template reviews straight to the webhook while the claims' allocations change.
type churnResult struct {
	Changes, Reviews *result
	Deadline         time.Duration
	// Over is how many reviews took longer than Deadline.
	Over int
}

// controllerManager is the user the held claims are written as. The webhook's configurations
// leave out claims that the controller-manager creates (the ones generated from templates, most
// of a real fleet's), so like those the held claims are not reviewed on their way in: a review
// of each of 40,000 creates would measure the writing, not the fleet. The admin may impersonate;
// system:masters keeps the admin's rights.
var controllerManager = rest.ImpersonationConfig{UserName: "system:kube-controller-manager", Groups: []string{"system:masters", "system:authenticated"}}

// claimsLoads writes the held claims into the largest fleet and measures with them in place.
func (r *runner) claimsLoads(ctx context.Context, n int) (*claimsResult, error) {
	devices, err := listDevices(ctx, r.cs, r.inv.driver)
	if err != nil {
		return nil, err
	}
	cr := &claimsResult{Devices: len(devices), Limit: r.ch.memoryLimit}
	if cr.Claims, err = claimsFor(r.o.Claims, len(devices)); err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(r.cfg)
	cfg.Impersonate = controllerManager
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	h := &holder{cs: cs, driver: r.inv.driver, class: r.ch.classes[0].Name, workers: r.o.Workers, devices: spread(devices), claims: cr.Claims}
	start := time.Now()
	if err := h.write(ctx); err != nil {
		return nil, err
	}
	cr.Written = time.Since(start)
	time.Sleep(5 * time.Second) // the webhook's informer takes the last claims in
	if cr.Mem, err = r.w.memory(); err != nil {
		return nil, err
	}
	if cr.Fresh, err = restartedMemory(ctx, r.ch, r.o, r.cs); err != nil {
		return nil, err
	}
	if cr.Restart, err = restartedMemory(ctx, r.ch, r.ch.asChart(r.o), r.cs); err != nil {
		return nil, err
	}
	if err := r.claimsDirect(ctx, n, cr, h); err != nil {
		return nil, err
	}
	if _, err := r.pendingPod(ctx); err != nil {
		return nil, err
	}
	if r.o.KubectlDra != "" {
		if cr.CLI, err = r.timeCLISettled(ctx); err != nil {
			return nil, err
		}
	}
	status, why := cr.CLI.medians()
	r.logger.Info("Claims phase done", "nodes", n, "claims", cr.Claims, "rssMiB", mib(cr.Mem.RSS), "restartPeakMiB", mib(cr.Restart.HWM), "status", status, "why", why)
	return cr, nil
}

// claimsDirect runs the loads straight to the webhook with the claims in place, with the
// controllers paused if asked: templates and pods at every claims rate against the baseline,
// then templates while the claims churn.
func (r *runner) claimsDirect(ctx context.Context, n int, cr *claimsResult, h *holder) error {
	if r.o.PauseControllers {
		defer pauseControllers(r.logger)()
	}
	for _, rate := range r.o.ClaimsRates {
		cr.Templates = append(cr.Templates, r.againstBaseline(ctx, n, "template reviews to the webhook, claims held", rate, r.templates, r.base.templates))
		cr.Pods = append(cr.Pods, r.againstBaseline(ctx, n, "pod reviews to the webhook, claims held", rate, r.pods, r.base.pods))
	}
	if r.o.ChurnRate == 0 || cr.Claims == 0 {
		return nil
	}
	var err error
	cr.Churn, err = churnLoad(ctx, r.o, h, r.templates.target(r.w.pid()))
	r.logger.Info("Claims churn", "nodes", n, "changes", cr.Churn.Changes.String(), "reviews", cr.Churn.Reviews.String(), "overDeadline", cr.Churn.Over, "overBySecond", overBySecond(cr.Churn.Reviews, cr.Churn.Deadline), "restoreErr", err)
	return err
}

// churnLoad sends template reviews to t at o's first claims rate while h changes the claims'
// allocations at o.ChurnRate, for o.Duration; then allocates again what the churn left
// deallocated, whose error it returns with the result. It returns once t's client has made the
// connections it was dialing: the API server's own next call to the webhook (the harness creates
// the why pod's claim next) would otherwise wait in the webhook's listen queue behind them, a
// dial of one client queued behind hundreds of another's (docs/performance.md, "What set off the
// tail at 2,000/s").
func churnLoad(ctx context.Context, o Options, h *holder, t target) (*churnResult, error) {
	rate := o.ClaimsRates[0]
	changes := int(o.Duration.Seconds() * float64(o.ChurnRate))
	var changed *result
	var restoreErr error
	collectBetweenLoads() // before the churn's writes start, not while they run (sampled's then has nothing to collect)
	done := make(chan struct{})
	go func() { defer close(done); changed, restoreErr = h.churn(ctx, o.ChurnRate, changes) }()
	reviews := sampled(t.pid, func() *result {
		return drive(ctx, "template reviews to the webhook, claims changing", rate, int(o.Duration.Seconds()*float64(rate)), t.review)
	})
	<-done
	t.settle(ctx)
	return &churnResult{Changes: changed, Reviews: reviews, Deadline: o.ReviewDeadline, Over: over(reviews.Lat, o.ReviewDeadline)}, restoreErr
}

// over counts the latencies above d.
func over(lat []time.Duration, d time.Duration) int {
	n := 0
	for _, l := range lat {
		if l > d {
			n++
		}
	}
	return n
}

// overBySecond counts r's answers slower than d by the second of the load they were sent in,
// up to the last second with one.
func overBySecond(r *result, d time.Duration) []int {
	var by []int
	for _, a := range r.Answers {
		if a.Lat <= d {
			continue
		}
		s := int(a.At / time.Second)
		for len(by) <= s {
			by = append(by, 0)
		}
		by[s]++
	}
	return by
}

// whyPod is the pending pod kubectl dra why is timed on.
const whyPod = "scale-why"

// pendingPod creates a claim for all GPUs of one node and a pod using it. Once there are as many
// held claims as nodes (spread), every node has a GPU held: the claim cannot be satisfied now,
// the pod stays Pending, and why has to read every claim to say who holds what.
func (r *runner) pendingPod(ctx context.Context) (string, error) {
	return createPendingPod(ctx, r.cs, r.ch.classes[0].Name)
}

// createPendingPod is pendingPod on cs, the claim asking for class.
func createPendingPod(ctx context.Context, cs kubernetes.Interface, class string) (string, error) {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: whyPod, Namespace: loadNamespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name:    heldRequest,
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 8},
		}}}},
	}
	if _, err := cs.ResourceV1().ResourceClaims(loadNamespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create ResourceClaim %s/%s: %w", loadNamespace, whyPod, err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: whyPod, Namespace: loadNamespace},
		Spec: corev1.PodSpec{
			Containers:     []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: &claim.Name}},
		},
	}
	if _, err := cs.CoreV1().Pods(loadNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create pod %s/%s: %w", loadNamespace, whyPod, err)
	}
	return whyPod, nil
}

// timeKubectlDra runs `kubectl dra ARGS...` once and returns how long the whole command took. Its
// output is kept in o.WorkDir (kubectl-dra-ARGS.txt), to see what it answered.
func timeKubectlDra(ctx context.Context, o Options, args ...string) (time.Duration, error) {
	r, err := runKubectlDra(ctx, o, args...)
	return r.Wall, err
}

// cliRun is what one command took: wall time, CPU time (user and system, which the machine's
// other work does not inflate as it does the wall time) and peak resident memory in bytes; and
// the CPU time the API server spent meanwhile, where the caller measures it.
type cliRun struct {
	Wall, CPU, ServerCPU time.Duration
	MaxRSS               int64
	// Others names the processes that took the most CPU meanwhile, where the caller notes them.
	Others string
}

// runKubectlDra is timeKubectlDra that also returns the CPU time and peak RSS of the command.
func runKubectlDra(ctx context.Context, o Options, args ...string) (cliRun, error) {
	if o.KubectlDra == "" {
		return cliRun{}, nil
	}
	cmd := exec.CommandContext(ctx, o.KubectlDra, append(args, "--kubeconfig", o.Kubeconfig)...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	r := cliRun{Wall: time.Since(start)}
	if err != nil {
		return cliRun{}, fmt.Errorf("kubectl dra %v: %w\n%.2000s", args, err, out)
	}
	r.CPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.MaxRSS = ru.Maxrss << 10 // kilobytes on Linux
	}
	name := "kubectl-dra-" + strings.NewReplacer("/", "-", " ", "-").Replace(strings.Join(args, " ")) + ".txt"
	return r, os.WriteFile(filepath.Join(o.WorkDir, name), out, 0o644)
}

// upstreamResult is our webhook against the upstream example webhook at the largest fleet,
// before any claim is held: template reviews at each of ClaimsRates, and the RSS of both after.
type upstreamResult struct {
	Templates   []*comparison
	Ours, Fresh memory
	// Theirs is the upstream webhook's after the loads, TheirsIdle settle after it answered /readyz.
	Theirs, TheirsIdle memory
}

// upstreamLoads starts the upstream example webhook and sends it the template reviews ours gets,
// interleaved, at every claims rate.
func (r *runner) upstreamLoads(ctx context.Context, n int, fresh memory) (*upstreamResult, error) {
	u, err := startUpstream(ctx, r.o.Upstream, r.inv.driver, filepath.Join(r.o.WorkDir, "upstream"))
	if err != nil {
		return nil, err
	}
	defer u.stop()
	rv, err := r.ch.upstreamTemplates(u, r.l)
	if err != nil {
		return nil, err
	}
	ur := &upstreamResult{Fresh: fresh}
	time.Sleep(settle) // as long after ready as fresh was read
	if ur.TheirsIdle, err = u.memory(); err != nil {
		return nil, err
	}
	func() {
		if r.o.PauseControllers {
			defer pauseControllers(r.logger)()
		}
		for _, rate := range r.o.ClaimsRates {
			count := int(r.o.Duration.Seconds() * float64(rate))
			ur.Templates = append(ur.Templates, r.repeated(ctx, n, "template reviews to the webhook", rate, count,
				r.templates.target(r.w.pid()), rv.target(u.pid()), upstreamLabel))
		}
	}()
	if ur.Ours, err = r.w.memory(); err != nil {
		return nil, err
	}
	if ur.Theirs, err = u.memory(); err != nil {
		return nil, err
	}
	r.logger.Info("Upstream comparison done", "nodes", n, "rssMiB", mib(ur.Ours.RSS), "upstreamRssMiB", mib(ur.Theirs.RSS))
	return ur, nil
}
