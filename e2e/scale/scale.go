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
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
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
}

// Limits of Validate: the harness runs on one machine next to its control plane.
const (
	maxNodes    = 10_000
	maxRate     = 5_000
	maxDuration = 2 * time.Minute
	maxPods     = 5_000
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
	if o.Workers < 1 || o.Workers > 256 {
		errs = append(errs, fmt.Errorf("--workers=%d: want 1..256", o.Workers))
	}
	return errors.Join(errs...)
}

// memLimit is the GOMEMLIMIT syntax: bytes with an optional binary unit.
var memLimit = regexp.MustCompile(`^[0-9]{1,19}(B|KiB|MiB|GiB|TiB)?$`)

// loadNamespace holds the dry-run reviews and the scheduling phase's pods.
const loadNamespace = "scale-load"

// Run measures every phase and writes the report to out.
func Run(ctx context.Context, o Options, out io.Writer) error {
	if err := o.Validate(); err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	cfg, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	// The harness is the load; its own client must not be what limits the rate.
	cfg.QPS, cfg.Burst = 1e5, 1e5
	cfg.WarningHandlerWithContext = countWarnings{}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	groups, err := nodegroups.LoadConfig(o.NodeGroups)
	if err != nil {
		return fmt.Errorf("--node-groups: %w", err)
	}
	ch, err := readChart(o.ChartRender)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		return err
	}
	w, err := startWebhook(ctx, ch, o, filepath.Join(o.WorkDir, "webhook"))
	if err != nil {
		return err
	}
	defer w.stop()
	if err := ch.install(ctx, cs, w.url(), w.ca); err != nil {
		return err
	}
	if err := w.waitReady(ctx, 2*time.Minute); err != nil {
		return err
	}
	driver := ch.classes[0].Name
	base, err := startBaseline(ctx, o, ch, groups, driver)
	if err != nil {
		return err
	}
	defer base.stop()
	inv := &inventory{cs: cs, groups: groups, driver: driver, workers: o.Workers}
	if o.Kwok != "" && o.SchedPods > 0 {
		inv.kwokNodes = o.SchedNodes
	}
	l := &loader{cs: cs, driver: driver}
	templates, pods, err := ch.reviewers(w, l)
	if err != nil {
		return err
	}
	rep := &report{o: o}
	have := 0
	for _, n := range o.Nodes {
		if err := inv.grow(ctx, have, n); err != nil {
			return err
		}
		have = n
		ph := &phase{Nodes: n}
		// Settle: the webhook's informers take in the last slices, the process returns what the
		// initial lists and the growth left over.
		time.Sleep(5 * time.Second)
		count := int(o.Duration.Seconds() * float64(o.Rate))
		if ph.Mem, err = w.memory(); err != nil {
			return err
		}
		// A webhook started now, with the fleet in place and no load behind it: what holding n
		// nodes takes, without what earlier phases' loads left in the process above.
		if ph.Fresh, err = restartedMemory(ctx, ch, o); err != nil {
			return err
		}
		// Each load is preceded by a second of the same, not counted: connections, TLS sessions and
		// the caches of a new inventory are warm in every phase alike.
		measure := func(name string, rate, count int, op func(context.Context, int) error) *result {
			drive(ctx, name, rate, rate, op)
			before, err := sampleCPU(w.cmd.Process.Pid)
			r := drive(ctx, name, rate, count, op)
			if after, err2 := sampleCPU(w.cmd.Process.Pid); err == nil && err2 == nil {
				r.Steal, r.Busy, r.CPU = stealPercent(before, after), busyPercent(before, after), cpuPer(before, after, r.Sent)
			}
			logger.Info("Phase", "nodes", n, "result", r.String())
			return r
		}
		// A round of a load straight to the webhooks: the fleet's and the baseline's in turns of
		// a second, so that both see the same host.
		paired := func(name string, rate, count int, op, baseOp func(context.Context, int) error) pair {
			drive(ctx, name, rate, rate, op)
			drive(ctx, name, rate, rate, baseOp)
			beforeF, errF := sampleCPU(w.cmd.Process.Pid)
			beforeB, errB := sampleCPU(base.w.cmd.Process.Pid)
			p := interleaved(ctx, name, rate, count, op, baseOp)
			afterF, errF2 := sampleCPU(w.cmd.Process.Pid)
			afterB, errB2 := sampleCPU(base.w.cmd.Process.Pid)
			if errors.Join(errF, errB, errF2, errB2) == nil {
				for _, r := range []*result{p.fleet, p.base} {
					r.Steal, r.Busy = stealPercent(beforeF, afterF), busyPercent(beforeF, afterF)
				}
				p.fleet.CPU, p.base.CPU = cpuPer(beforeF, afterF, p.fleet.Sent), cpuPer(beforeB, afterB, p.base.Sent)
			}
			logger.Info("Phase", "nodes", n, "result", p.fleet.String())
			logger.Info("Phase", "nodes", 1, "result", p.base.String())
			return p
		}
		ph.Template = measure("template validation", o.Rate, count, l.template)
		ph.Pod = measure("pod mutation", o.Rate, count, l.dryRunPod)
		func() {
			if o.PauseControllers {
				defer pauseControllers(logger)()
			}
			// A p99 is the slowest hundredth: a few seconds of a busy host move it. The loads
			// straight to the webhook, which the latency targets are about, run in rounds that
			// interleave the same load on the baseline webhook, until three rounds were quiet.
			repeated := func(name string, rate, count int, op, baseOp func(context.Context, int) error) *comparison {
				var pairs []pair
				for len(pairs) < maxRounds && !enoughQuiet(pairs) {
					pairs = append(pairs, paired(name, rate, count, op, baseOp))
				}
				c := compare(pairs)
				logger.Info("Phase", "nodes", n, "load", name, "comparison", c.String())
				return c
			}
			ph.PodDirect = repeated("pod reviews to the webhook", o.Rate, count, pods.review, base.pods.review)
			if o.HighRate > 0 {
				ph.High = repeated("template reviews to the webhook", o.HighRate, int(o.Duration.Seconds()*float64(o.HighRate)), templates.review, base.templates.review)
			}
		}()
		if ph.Status, err = timeStatus(ctx, o.KubectlDra, o.Kubeconfig); err != nil {
			return err
		}
		if n == o.SchedNodes && inv.kwokNodes > 0 {
			if ph.Sched, err = schedule(ctx, o, cs, l, n); err != nil {
				return err
			}
		}
		// Memory again after the load: what the caches, the verdicts and the handlers hold.
		if m, err := w.memory(); err == nil {
			ph.MemAfter = m
		}
		logger.Info("Phase done", "nodes", n, "rssMiB", mib(ph.Mem.RSS), "rssAfterLoadMiB", mib(ph.MemAfter.RSS), "status", ph.Status)
		rep.phases = append(rep.phases, ph)
	}
	rep.print(out)
	if f, err := os.Create(filepath.Join(o.WorkDir, "scale.md")); err == nil {
		rep.print(f)
		f.Close()
	}
	return nil
}

// restartedMemory starts a second webhook (not registered: it only syncs its caches) and reads its
// memory 10 s after it is ready. It lists everything at once, unlike the registered one that took
// the fleet in node by node: its peak is what a memory limit must allow.
func restartedMemory(ctx context.Context, ch *chart, o Options) (memory, error) {
	w, err := startWebhook(ctx, ch, o, filepath.Join(o.WorkDir, "webhook-restart"))
	if err != nil {
		return memory{}, err
	}
	defer w.stop()
	start := time.Now()
	if err := w.waitReady(ctx, 5*time.Minute); err != nil {
		return memory{}, err
	}
	synced := time.Since(start)
	time.Sleep(10 * time.Second)
	m, err := w.memory()
	m.Synced = synced
	return m, err
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
