// Package scale measures the webhook and kubectl dra against a fleet of fake GPU nodes on a real
// control plane with no kubelets (`make scale`): nodes are Node objects, their ResourceSlices are
// published by the plugin's own code path (simulated devices of the node's group, the DRA library's
// ResourceSlice controller), and kwok marks the nodes of the scheduling phase Ready and their pods
// Running. The webhook runs as a local process with the chart's flags, behind the chart's webhook
// configurations pointed at loopback. Every load is bounded in count and rate.
package scale

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"time"

	"k8s.io/client-go/kubernetes"
)

// Options configure a run; every count is bounded by Validate.
type Options struct {
	Kubeconfig string
	// ChartRender is a rendered chart (charts/charttest/testdata/k8s-*.golden).
	ChartRender string
	NodeGroups  string
	Webhook     string // gpu-webhook binary
	KubectlDra  string // kubectl-dra binary
	Kwok        string // kwok binary; empty skips the scheduling phase
	KwokStages  string // the sigs.k8s.io/kwok module directory, whose stages kwok runs
	// BaselineAssets holds etcd and kube-apiserver (KUBEBUILDER_ASSETS) of the cluster's release,
	// for the baseline webhook's control plane.
	BaselineAssets string
	WorkDir        string
	// GOGC and GOMemLimit of the webhook processes: by default GOGC=100 and no limit, so that
	// the RSS measured is what the process takes; the chart runs it with GOGC=400 and its
	// memory limit.
	GOGC, GOMemLimit string

	// Nodes are the fleet sizes measured in turn, ascending.
	Nodes []int
	// Rate is the rate of templates and pods created through the API server in every phase, per
	// second; HighRate that of template AdmissionReviews sent straight to the webhook.
	Rate, HighRate int
	// Duration of each load at each rate.
	Duration time.Duration
	// SchedNodes is the phase (one of Nodes) at which SchedPods annotated pods are created at
	// Rate and placed on kwok nodes.
	SchedNodes, SchedPods int
	Workers               int
	// PauseControllers stops the controller-manager and the scheduler during the loads sent
	// straight to the webhook (see controllers).
	PauseControllers bool

	// Claims is the fraction of the largest fleet's GPUs held by allocated claims (one GPU
	// each) while ClaimsRates, the churn and kubectl dra status and why are measured; 0 skips.
	Claims float64
	// ClaimsRates are the rates of template and pod reviews straight to the webhook at the
	// largest fleet, with the claims held and against the upstream webhook.
	ClaimsRates []int
	// ChurnRate is how many allocations change per second while template reviews run at the
	// first of ClaimsRates (0 skips); ReviewDeadline is what each review should stay within.
	ChurnRate      int
	ReviewDeadline time.Duration
	// Upstream is the upstream example driver's webhook binary; empty skips the comparison.
	Upstream string
}

// Limits of Validate: the harness runs on one machine next to its control plane.
const (
	maxNodes    = 10_000
	maxRate     = 5_000
	maxDuration = 2 * time.Minute
	maxPods     = 5_000
	maxClaims   = 100_000
	maxChurn    = 1_000
	maxDeadline = 30 * time.Second
)

// Validate bounds every count and names the flag to fix.
func (o *Options) Validate() error {
	var errs []error
	if len(o.Nodes) == 0 || !slices.IsSorted(o.Nodes) || o.Nodes[0] < 1 || o.Nodes[len(o.Nodes)-1] > maxNodes {
		errs = append(errs, fmt.Errorf("--nodes=%v: want ascending sizes in 1..%d, e.g. 1,100,1000,5000", o.Nodes, maxNodes))
	}
	if o.Rate < 1 || o.Rate > maxRate || o.HighRate < 0 || o.HighRate > maxRate {
		errs = append(errs, fmt.Errorf("--rate=%d, --high-rate=%d: want 1..%d (0 skips the high rate)", o.Rate, o.HighRate, maxRate))
	}
	if o.Duration <= 0 || o.Duration > maxDuration {
		errs = append(errs, fmt.Errorf("--duration=%s: want up to %s", o.Duration, maxDuration))
	}
	if o.SchedPods < 0 || o.SchedPods > maxPods {
		errs = append(errs, fmt.Errorf("--sched-pods=%d: want 0..%d", o.SchedPods, maxPods))
	}
	if o.Kwok != "" && o.SchedPods > 0 && !slices.Contains(o.Nodes, o.SchedNodes) {
		errs = append(errs, fmt.Errorf("--sched-nodes=%d: must be one of --nodes %v", o.SchedNodes, o.Nodes))
	}
	if o.GOMemLimit != "off" && !memLimit.MatchString(o.GOMemLimit) {
		errs = append(errs, fmt.Errorf("--webhook-gomemlimit=%q: want off or a size as Go reads GOMEMLIMIT, e.g. 256MiB", o.GOMemLimit))
	}
	if o.BaselineAssets == "" {
		errs = append(errs, errors.New("--baseline-assets: want the directory of etcd and kube-apiserver for the baseline webhook's control plane (e2e/cluster/envtest-assets.sh)"))
	}
	if math.IsNaN(o.Claims) || o.Claims < 0 || o.Claims > 1 {
		errs = append(errs, fmt.Errorf("--claims=%v: want the fraction of the largest fleet's GPUs allocated, 0 to 1 (0 skips)", o.Claims))
	}
	if len(o.ClaimsRates) > 4 || slices.ContainsFunc(o.ClaimsRates, func(r int) bool { return r < 1 || r > maxRate }) {
		errs = append(errs, fmt.Errorf("--claims-rates=%v: want at most 4 rates in 1..%d, e.g. 1000,2000", o.ClaimsRates, maxRate))
	}
	if (o.Claims > 0 || o.Upstream != "") && len(o.ClaimsRates) == 0 {
		errs = append(errs, errors.New("--claims-rates: want a rate for the loads with claims held and against --upstream-webhook, e.g. 1000,2000"))
	}
	if o.ChurnRate < 0 || o.ChurnRate > maxChurn {
		errs = append(errs, fmt.Errorf("--claims-churn=%d: want 0..%d changes per second", o.ChurnRate, maxChurn))
	}
	if o.ReviewDeadline <= 0 || o.ReviewDeadline > maxDeadline {
		errs = append(errs, fmt.Errorf("--review-deadline=%s: want up to %s", o.ReviewDeadline, maxDeadline))
	}
	if o.Workers < 1 || o.Workers > 256 {
		errs = append(errs, fmt.Errorf("--workers=%d: want 1..256", o.Workers))
	}
	return errors.Join(errs...)
}

// memLimit is the GOMEMLIMIT syntax: bytes with an optional binary unit.
var memLimit = regexp.MustCompile(`^[0-9]{1,19}(B|KiB|MiB|GiB|TiB)?$`)

// loadNamespace holds the dry-run reviews and the scheduling phase's pods.
const loadNamespace = "scale-load"

// restartedMemory starts a second webhook (not registered: it only syncs its caches) and reads its
// memory 10 s after it is ready. It lists everything at once, unlike the registered one that took
// the fleet in node by node: its peak is what a memory limit must allow. What the webhook did
// meanwhile, and what the API server wrote of what it keeps, come with the reading.
func restartedMemory(ctx context.Context, ch *chart, o Options, cs kubernetes.Interface) (memory, error) {
	counter, err := countWrites(ctx, cs)
	if err != nil {
		return memory{}, err
	}
	defer counter.Stop()
	w, synced, err := startReady(ctx, ch, o, filepath.Join(o.WorkDir, "webhook-restart"))
	if err != nil {
		return memory{}, err
	}
	defer w.stop()
	pid := strconv.Itoa(w.pid())
	_, ready, err := procStat(pid)
	if err != nil {
		return memory{}, err
	}
	time.Sleep(settle)
	m, err := w.memory()
	if err != nil {
		return m, err
	}
	_, read, err := procStat(pid)
	if err != nil {
		return m, err
	}
	m.Synced = synced
	m.Meanwhile = &activity{ToReady: ticks(ready), Settled: ticks(read - ready), Writes: counter.Stop()}
	return m, nil
}

// startReady starts the webhook o.Webhook and waits until it is ready, which it returns how long
// it took.
func startReady(ctx context.Context, ch *chart, o Options, dir string) (*webhook, time.Duration, error) {
	w, err := startWebhook(ctx, ch, o, dir)
	if err != nil {
		return nil, 0, err
	}
	start := time.Now()
	if err := w.waitReady(ctx, 5*time.Minute); err != nil {
		w.stop()
		return nil, 0, err
	}
	return w, time.Since(start), nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
