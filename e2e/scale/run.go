package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// Run measures every phase and writes the report to out.
func Run(ctx context.Context, o Options, out io.Writer) error {
	if err := o.Validate(); err != nil {
		return err
	}
	defer collectRarely()()
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
	cfg             *rest.Config
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
	var err error
	if r.cfg, err = clientcmd.BuildConfigFromFlags("", o.Kubeconfig); err != nil {
		return r, fmt.Errorf("--kubeconfig: %w", err)
	}
	// The harness is the load; its own client must not be what limits the rate.
	r.cfg.QPS, r.cfg.Burst = 1e5, 1e5
	r.cfg.WarningHandlerWithContext = countWarnings{}
	if r.cs, err = kubernetes.NewForConfig(r.cfg); err != nil {
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
	if ph.Fresh, err = restartedMemory(ctx, r.ch, r.o, r.cs); err != nil {
		return nil, err
	}
	ph.Template = r.measure(ctx, n, "template validation", r.o.Rate, count, r.l.template)
	ph.Pod = r.measure(ctx, n, "pod mutation", r.o.Rate, count, r.l.dryRunPod)
	r.directLoads(ctx, ph)
	if ph.Status, err = timeKubectlDra(ctx, r.o, "status"); err != nil {
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
	if n == r.o.Nodes[len(r.o.Nodes)-1] {
		if err := r.largest(ctx, ph); err != nil {
			return nil, err
		}
	}
	r.logger.Info("Phase done", "nodes", n, "rssMiB", mib(ph.Mem.RSS), "rssAfterLoadMiB", mib(ph.MemAfter.RSS), "status", ph.Status)
	return ph, nil
}

// largest measures what only the largest fleet is measured with: our webhook against the
// upstream example webhook before any claim is held, then the held claims.
func (r *runner) largest(ctx context.Context, ph *phase) error {
	var err error
	if r.o.Upstream != "" && len(r.o.ClaimsRates) > 0 {
		if ph.Upstream, err = r.upstreamLoads(ctx, ph.Nodes, ph.Fresh); err != nil {
			return err
		}
	}
	if r.o.Claims > 0 {
		if ph.Claims, err = r.claimsLoads(ctx, ph.Nodes); err != nil {
			return err
		}
	}
	return nil
}

// directLoads sends the loads straight to the webhook, with the controllers paused if asked. A
// p99 is the slowest hundredth: a few seconds of a busy host move it. These loads, which the
// latency targets are about, run in rounds that interleave the same load on the baseline webhook,
// until three rounds were quiet.
func (r *runner) directLoads(ctx context.Context, ph *phase) {
	if r.o.PauseControllers {
		defer pauseControllers(r.logger)()
	}
	ph.PodDirect = r.againstBaseline(ctx, ph.Nodes, "pod reviews to the webhook", r.o.Rate, r.pods, r.base.pods)
	if r.o.HighRate > 0 {
		ph.High = r.againstBaseline(ctx, ph.Nodes, "template reviews to the webhook", r.o.HighRate, r.templates, r.base.templates)
	}
}

// againstBaseline is a load of Duration at rate, straight to the webhook and to the baseline's.
func (r *runner) againstBaseline(ctx context.Context, n int, name string, rate int, rv, baseRv *reviewer) *comparison {
	count := int(r.o.Duration.Seconds() * float64(rate))
	return r.repeated(ctx, n, name, rate, count, rv.target(r.w.pid()), baseRv.target(r.base.w.pid()), baselineLabel)
}

// measure drives one load through the API server. It is preceded by a second of the same, not
// counted: connections, TLS sessions and the caches of a new inventory are warm in every phase
// alike.
func (r *runner) measure(ctx context.Context, n int, name string, rate, count int, op func(context.Context, int) error) *result {
	drive(ctx, name, rate, rate, op)
	res := sampled(r.w.pid(), func() *result { return drive(ctx, name, rate, count, op) })
	r.logger.Info("Phase", "nodes", n, "result", res.String())
	return res
}

// sampled runs load and adds to its result the host's steal, the machine's busy share and the
// CPU time per request of the process pid while it ran.
func sampled(pid int, load func() *result) *result {
	collectBetweenLoads()
	before, err := sampleCPU(pid)
	res := load()
	if after, err2 := sampleCPU(pid); err == nil && err2 == nil {
		res.Steal, res.Busy, res.CPU = stealPercent(before, after), busyPercent(before, after), cpuPer(before, after, res.Sent)
	}
	return res
}

// target is where a load straight to a webhook goes: one review, the process serving it (whose
// CPU time is read) and the count of connections its client is making (nil: none counted).
type target struct {
	review  func(context.Context, int) error
	pid     int
	dialing *atomic.Int64
}

// settle waits until t's client has made or given up the connections it was dialing, at most
// as long as it waits for a handshake. A load whose requests queued leaves dials going after its
// last answer (a request that dialed, then took a connection another freed, does not cancel its
// dial), and their handshakes would land in the next load, on the other webhook of a pair: a
// storm of the upstream webhook's then measured ours.
func (t target) settle(ctx context.Context) {
	if t.dialing == nil {
		return
	}
	deadline := time.Now().Add(apiServerHandshakeTimeout)
	for t.dialing.Load() > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
}

// repeated runs rounds of paired until enough of them were quiet, and compares them; against
// names what b is in the report.
func (r *runner) repeated(ctx context.Context, n int, name string, rate, count int, a, b target, against string) *comparison {
	var pairs []pair
	for len(pairs) < maxRounds && !enoughQuiet(pairs) {
		pairs = append(pairs, r.paired(ctx, n, name, rate, count, a, b, against))
	}
	c := compare(pairs, against)
	r.logger.Info("Phase", "nodes", n, "load", name, "comparison", c.String())
	return c
}

// paired is a round of a load straight to two webhooks: a (the fleet's) and b in turns of a
// second, so that both see the same host.
func (r *runner) paired(ctx context.Context, n int, name string, rate, count int, a, b target, against string) pair {
	drive(ctx, name, rate, rate, a.review)
	a.settle(ctx)
	drive(ctx, name, rate, rate, b.review)
	b.settle(ctx)
	beforeA, errA := sampleCPU(a.pid)
	beforeB, errB := sampleCPU(b.pid)
	p := interleaved(ctx, name, rate, count, a, b)
	afterA, errA2 := sampleCPU(a.pid)
	afterB, errB2 := sampleCPU(b.pid)
	if errors.Join(errA, errB, errA2, errB2) == nil {
		for _, res := range []*result{p.fleet, p.base} {
			res.Steal, res.Busy = stealPercent(beforeA, afterA), busyPercent(beforeA, afterA)
		}
		p.fleet.CPU, p.base.CPU = cpuPer(beforeA, afterA, p.fleet.Sent), cpuPer(beforeB, afterB, p.base.Sent)
	}
	p.base.Name = name + " (" + against + ")"
	r.logger.Info("Phase", "nodes", n, "result", p.fleet.String())
	r.logger.Info("Phase", "against", against, "result", p.base.String())
	return p
}
