package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// Run measures every phase and writes the report to out.
func Run(ctx context.Context, o Options, out io.Writer) error {
	if err := o.Validate(); err != nil {
		return err
	}
	r, err := start(ctx, o)
	defer r.stop()
	if err != nil {
		return err
	}
	rep := &report{o: o}
	have := 0
	for _, n := range o.Nodes {
		if err := r.inv.grow(ctx, have, n); err != nil {
			return err
		}
		have = n
		ph, err := r.phase(ctx, n)
		if err != nil {
			return err
		}
		rep.phases = append(rep.phases, ph)
	}
	rep.print(out)
	if f, err := os.Create(filepath.Join(o.WorkDir, "scale.md")); err == nil {
		rep.print(f)
		f.Close()
	}
	return nil
}

// runner is what a run measures with: the webhook under load with the chart's configurations
// installed, the baseline webhook, the fleet and the loads.
type runner struct {
	o               Options
	logger          klog.Logger
	cs              kubernetes.Interface
	ch              *chart
	w               *webhook
	base            *baseline
	inv             *inventory
	l               *loader
	templates, pods *reviewer
}

// start brings up the webhook, the chart's configurations and the baseline; stop ends whatever
// started, also after an error.
func start(ctx context.Context, o Options) (*runner, error) {
	r := &runner{o: o, logger: klog.FromContext(ctx)}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return r, fmt.Errorf("--kubeconfig: %w", err)
	}
	// The harness is the load; its own client must not be what limits the rate.
	cfg.QPS, cfg.Burst = 1e5, 1e5
	cfg.WarningHandlerWithContext = countWarnings{}
	if r.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return r, err
	}
	groups, err := nodegroups.LoadConfig(o.NodeGroups)
	if err != nil {
		return r, fmt.Errorf("--node-groups: %w", err)
	}
	if r.ch, err = readChart(o.ChartRender); err != nil {
		return r, err
	}
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		return r, err
	}
	if r.w, err = startWebhook(ctx, r.ch, o, filepath.Join(o.WorkDir, "webhook")); err != nil {
		return r, err
	}
	if err := r.ch.install(ctx, r.cs, r.w.url(), r.w.ca); err != nil {
		return r, err
	}
	if err := r.w.waitReady(ctx, 2*time.Minute); err != nil {
		return r, err
	}
	driver := r.ch.classes[0].Name
	if r.base, err = startBaseline(ctx, o, r.ch, groups, driver); err != nil {
		return r, err
	}
	r.inv = &inventory{cs: r.cs, groups: groups, driver: driver, workers: o.Workers}
	if o.Kwok != "" && o.SchedPods > 0 {
		r.inv.kwokNodes = o.SchedNodes
	}
	r.l = &loader{cs: r.cs, driver: driver}
	r.templates, r.pods, err = r.ch.reviewers(r.w, r.l)
	return r, err
}

// stop ends the baseline, then the webhook.
func (r *runner) stop() {
	if r.base != nil {
		r.base.stop()
	}
	if r.w != nil {
		r.w.stop()
	}
}

// phase measures the fleet of n nodes: memory, the loads through the API server and straight to
// the webhook, kubectl dra status and, at o.SchedNodes, the scheduling of annotated pods.
func (r *runner) phase(ctx context.Context, n int) (*phase, error) {
	ph := &phase{Nodes: n}
	// Settle: the webhook's informers take in the last slices, the process returns what the
	// initial lists and the growth left over.
	time.Sleep(5 * time.Second)
	count := int(r.o.Duration.Seconds() * float64(r.o.Rate))
	var err error
	if ph.Mem, err = r.w.memory(); err != nil {
		return nil, err
	}
	// A webhook started now, with the fleet in place and no load behind it: what holding n
	// nodes takes, without what earlier phases' loads left in the process above.
	if ph.Fresh, err = restartedMemory(ctx, r.ch, r.o); err != nil {
		return nil, err
	}
	ph.Template = r.measure(ctx, n, "template validation", r.o.Rate, count, r.l.template)
	ph.Pod = r.measure(ctx, n, "pod mutation", r.o.Rate, count, r.l.dryRunPod)
	r.directLoads(ctx, ph, count)
	if ph.Status, err = timeStatus(ctx, r.o.KubectlDra, r.o.Kubeconfig); err != nil {
		return nil, err
	}
	if n == r.o.SchedNodes && r.inv.kwokNodes > 0 {
		if ph.Sched, err = schedule(ctx, r.o, r.cs, r.l, n); err != nil {
			return nil, err
		}
	}
	// Memory again after the load: what the caches, the verdicts and the handlers hold.
	if m, err := r.w.memory(); err == nil {
		ph.MemAfter = m
	}
	r.logger.Info("Phase done", "nodes", n, "rssMiB", mib(ph.Mem.RSS), "rssAfterLoadMiB", mib(ph.MemAfter.RSS), "status", ph.Status)
	return ph, nil
}

// directLoads sends the loads straight to the webhook, with the controllers paused if asked. A
// p99 is the slowest hundredth: a few seconds of a busy host move it. These loads, which the
// latency targets are about, run in rounds that interleave the same load on the baseline webhook,
// until three rounds were quiet.
func (r *runner) directLoads(ctx context.Context, ph *phase, count int) {
	if r.o.PauseControllers {
		defer pauseControllers(r.logger)()
	}
	ph.PodDirect = r.repeated(ctx, ph.Nodes, "pod reviews to the webhook", r.o.Rate, count, r.pods.review, r.base.pods.review)
	if r.o.HighRate > 0 {
		highCount := int(r.o.Duration.Seconds() * float64(r.o.HighRate))
		ph.High = r.repeated(ctx, ph.Nodes, "template reviews to the webhook", r.o.HighRate, highCount, r.templates.review, r.base.templates.review)
	}
}

// measure drives one load through the API server. It is preceded by a second of the same, not
// counted: connections, TLS sessions and the caches of a new inventory are warm in every phase
// alike.
func (r *runner) measure(ctx context.Context, n int, name string, rate, count int, op func(context.Context, int) error) *result {
	drive(ctx, name, rate, rate, op)
	before, err := sampleCPU(r.w.cmd.Process.Pid)
	res := drive(ctx, name, rate, count, op)
	if after, err2 := sampleCPU(r.w.cmd.Process.Pid); err == nil && err2 == nil {
		res.Steal, res.Busy, res.CPU = stealPercent(before, after), busyPercent(before, after), cpuPer(before, after, res.Sent)
	}
	r.logger.Info("Phase", "nodes", n, "result", res.String())
	return res
}

// repeated runs rounds of paired until enough of them were quiet, and compares them.
func (r *runner) repeated(ctx context.Context, n int, name string, rate, count int, op, baseOp func(context.Context, int) error) *comparison {
	var pairs []pair
	for len(pairs) < maxRounds && !enoughQuiet(pairs) {
		pairs = append(pairs, r.paired(ctx, n, name, rate, count, op, baseOp))
	}
	c := compare(pairs)
	r.logger.Info("Phase", "nodes", n, "load", name, "comparison", c.String())
	return c
}

// paired is a round of a load straight to the webhooks: the fleet's and the baseline's in turns of
// a second, so that both see the same host.
func (r *runner) paired(ctx context.Context, n int, name string, rate, count int, op, baseOp func(context.Context, int) error) pair {
	drive(ctx, name, rate, rate, op)
	drive(ctx, name, rate, rate, baseOp)
	beforeF, errF := sampleCPU(r.w.cmd.Process.Pid)
	beforeB, errB := sampleCPU(r.base.w.cmd.Process.Pid)
	p := interleaved(ctx, name, rate, count, op, baseOp)
	afterF, errF2 := sampleCPU(r.w.cmd.Process.Pid)
	afterB, errB2 := sampleCPU(r.base.w.cmd.Process.Pid)
	if errors.Join(errF, errB, errF2, errB2) == nil {
		for _, res := range []*result{p.fleet, p.base} {
			res.Steal, res.Busy = stealPercent(beforeF, afterF), busyPercent(beforeF, afterF)
		}
		p.fleet.CPU, p.base.CPU = cpuPer(beforeF, afterF, p.fleet.Sent), cpuPer(beforeB, afterB, p.base.Sent)
	}
	r.logger.Info("Phase", "nodes", n, "result", p.fleet.String())
	r.logger.Info("Phase", "nodes", 1, "result", p.base.String())
	return p
}
