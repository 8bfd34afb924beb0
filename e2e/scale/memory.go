package scale

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// MemoryOptions configure Memory, the webhook's memory at the largest fleet without a cluster.
type MemoryOptions struct {
	// Webhooks are gpu-webhook binaries measured in turn, round by round (before and after a
	// change, interleaved so that both see the same host).
	Webhooks []string
	// GOMemLimits, when set, are the GOMEMLIMIT each of Webhooks runs with where the chart's
	// applies ("" for the chart's): a binary before a change of the chart against one after.
	GOMemLimits []string
	Rounds      int
	// Measure is what the rounds measure (measureKinds), all of them when empty.
	Measure []string
	// NodeWrites is how many times a second a Node's status is written during the rounds without
	// claims (0: none), as the kubelets and controllers of a fleet do.
	NodeWrites int
	// Stall is how long each webhook is stopped during the stall load (measureStall).
	Stall time.Duration
}

// What MemoryOptions.Measure may name: the rounds without claims, the memory with claims,
// template reviews while the claims change, and template reviews to a webhook stopped for a moment
// (the last two latency, not memory: one binary against another on the same control plane, where
// a full run compares runs days apart).
const (
	measureIdle   = "idle"
	measureClaims = "claims"
	measureChurn  = "churn"
	measureStall  = "stall"
)

var measureKinds = []string{measureIdle, measureClaims, measureChurn, measureStall}

// measures is whether the rounds measure kind.
func (mo MemoryOptions) measures(kind string) bool {
	return len(mo.Measure) == 0 || slices.Contains(mo.Measure, kind)
}

// Validate bounds the rounds and names the flag to fix.
func (mo MemoryOptions) Validate() error {
	if len(mo.Webhooks) == 0 || mo.Rounds < 1 || mo.Rounds > maxMemoryRounds {
		return fmt.Errorf("--memory-webhooks=%v, --memory-rounds=%d: want at least one binary and 1..%d rounds", mo.Webhooks, mo.Rounds, maxMemoryRounds)
	}
	if len(mo.GOMemLimits) > 0 && len(mo.GOMemLimits) != len(mo.Webhooks) {
		return fmt.Errorf("--memory-gomemlimits=%v: want one per --memory-webhooks binary (%d), empty for the chart's", mo.GOMemLimits, len(mo.Webhooks))
	}
	for _, l := range mo.GOMemLimits {
		if l != "" && !memLimit.MatchString(l) {
			return fmt.Errorf("--memory-gomemlimits: %q: want a size as Go reads GOMEMLIMIT, e.g. 128MiB", l)
		}
	}
	if mo.NodeWrites < 0 || mo.NodeWrites > maxNodeWrites {
		return fmt.Errorf("--memory-node-writes=%d: want 0..%d a second", mo.NodeWrites, maxNodeWrites)
	}
	if mo.measures(measureStall) && (mo.Stall <= 0 || mo.Stall > maxStall) {
		return fmt.Errorf("--memory-stall=%s: want more than 0 and at most %s, e.g. 100ms", mo.Stall, maxStall)
	}
	for _, k := range mo.Measure {
		if !slices.Contains(measureKinds, k) {
			return fmt.Errorf("--memory-measure: %q: want some of %s, comma-separated", k, strings.Join(measureKinds, ","))
		}
	}
	return nil
}

// maxStall bounds MemoryOptions.Stall: a second is a backlog of thousands of reviews at the
// top rate, past what the API server's own timeouts would let pile up.
const maxStall = time.Second

// maxMemoryRounds bounds MemoryOptions.Rounds.
const maxMemoryRounds = 10

// Memory measures what the webhook's memory targets are about, on a control plane of its own
// (envtest's etcd and kube-apiserver from o.BaselineAssets) holding the largest of o.Nodes and
// then o.Claims of its GPUs held: no kubelets, no scheduler, no controllers. Every round starts
// each binary afresh:
//   - without claims: RSS 10 s after /readyz with o's GOGC and GOMEMLIMIT, against the upstream
//     example webhook's (o.Upstream) started the same way;
//   - with the claims, as the chart runs it (its GOGC, GOMEMLIMIT at its memory limit): the peak
//     RSS of the start (VmHWM) and the RSS 10 s after /readyz;
//   - with the claims, with o's GOGC and GOMEMLIMIT and as the chart runs it: RSS after template
//     and pod reviews straight to the webhook at each of o.ClaimsRates for o.Duration;
//   - with the claims, with o's GOGC and GOMEMLIMIT: template reviews at the first of
//     o.ClaimsRates while the claims change at o.ChurnRate (0 skips), their latency;
//   - without claims, before any claim is written: template reviews at the last of o.ClaimsRates
//     to each binary and the upstream webhook, each stopped for mo.Stall (stallRounds).
//
// o.Claims of 0 stops after the rounds without claims; mo.Measure picks some of the four.
func Memory(ctx context.Context, o Options, mo MemoryOptions, out io.Writer) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if err := mo.Validate(); err != nil {
		return err
	}
	if need := stallAt + mo.Stall + time.Second; mo.measures(measureStall) && o.Duration < need {
		return fmt.Errorf("--duration=%s: the stall load needs at least %s (the stop %s in, %s long, and a second after)", o.Duration, need, stallAt, mo.Stall)
	}
	defer collectRarely()() // as in Run: the driver's own collections would stall the loads
	logger := klog.FromContext(ctx)
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		return err
	}
	env := &envtest.Environment{BinaryAssetsDirectory: o.BaselineAssets, ControlPlane: envtest.ControlPlane{APIServer: &envtest.APIServer{}}}
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("control plane (--baseline-assets=%s): %w", o.BaselineAssets, err)
	}
	defer func() { _ = env.Stop() }()
	o.Kubeconfig = filepath.Join(o.WorkDir, "kubeconfig")
	if err := writeKubeconfig(cfg, o.Kubeconfig); err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 1e5, 1e5
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	n := o.Nodes[len(o.Nodes)-1]
	ch, driver, err := writeFleet(ctx, cs, o.NodeGroups, o.ChartRender, o.Workers, n)
	if err != nil {
		return err
	}
	m := &memoryRun{o: o, ch: ch, l: &loader{cs: cs, driver: driver}, logger: logger}
	fmt.Fprintf(out, "## Webhook memory, %d nodes (MiB: RSS, anonymous, file-backed; peak = VmHWM)\n\n", n)
	if mo.measures(measureIdle) {
		if err := m.idleRounds(ctx, out, cs, mo, driver); err != nil {
			return err
		}
	}
	if mo.measures(measureStall) {
		if err := m.stallRounds(ctx, out, mo, driver); err != nil {
			return err
		}
	}
	if o.Claims == 0 {
		fmt.Fprintf(out, "\n(--claims=0: no claims written, nothing measured with claims held)\n")
		return nil
	}
	if !mo.measures(measureClaims) && !mo.measures(measureChurn) {
		return nil
	}
	h, err := m.writeClaims(ctx, cfg, cs, driver)
	if err != nil {
		return err
	}
	if mo.measures(measureClaims) {
		fmt.Fprintf(out, "\n### %d claims held\n\n", m.claims)
		for round := range mo.Rounds {
			for i, bin := range mo.Webhooks {
				asChart := ch.asChart(o)
				if len(mo.GOMemLimits) > 0 && mo.GOMemLimits[i] != "" {
					asChart.GOMemLimit = mo.GOMemLimits[i]
				}
				if err := m.withClaims(ctx, out, bin, round, o, asChart); err != nil {
					return err
				}
			}
		}
	}
	if mo.measures(measureChurn) && o.ChurnRate > 0 {
		return m.churnRounds(ctx, out, mo, h)
	}
	return nil
}

// idleRounds measures each binary, and the upstream webhook, without claims.
func (m *memoryRun) idleRounds(ctx context.Context, out io.Writer, cs kubernetes.Interface, mo MemoryOptions, driver string) (err error) {
	o := m.o
	fmt.Fprintf(out, "### No claims, %d s after ready, GOGC=%s GOMEMLIMIT=%s, %d Node writes a second\n\n",
		int(settle.Seconds()), o.GOGC, o.GOMemLimit, mo.NodeWrites)
	writer := writeNodes(ctx, cs, o.Nodes[len(o.Nodes)-1], mo.NodeWrites)
	defer func() {
		n, werr := writer.stop()
		if mo.NodeWrites > 0 {
			fmt.Fprintf(out, "- %d Node writes made during the rounds\n", n)
		}
		if err == nil {
			err = werr
		}
	}()
	for round := range mo.Rounds {
		for _, bin := range mo.Webhooks {
			mem, err := m.idle(ctx, bin, o, fmt.Sprintf("idle-%d", round))
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "- round %d %s: %s\n", round+1, filepath.Base(bin), mem)
		}
		if o.Upstream != "" {
			mem, err := m.upstream(ctx, driver, round)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "- round %d upstream %s: %s\n", round+1, filepath.Base(o.Upstream), mem)
		}
	}
	return nil
}

// settle is how long after /readyz the memory of a webhook without load is read.
const settle = 10 * time.Second

type memoryRun struct {
	o      Options
	ch     *chart
	l      *loader
	logger klog.Logger
	claims int
}

// memoryReading is one process's memory at one moment, as the report prints it.
type memoryReading struct {
	memory
	Ready time.Duration
}

func (r memoryReading) String() string {
	s := fmt.Sprintf("RSS %.1f (anon %.1f, file %.1f), peak %.1f", mib(r.RSS), mib(r.Anon), mib(r.RSS-r.Anon), mib(r.HWM))
	if r.Live > 0 {
		s += fmt.Sprintf(", live heap %.1f, heap in use %.1f, stacks %.1f", mib(r.Live), mib(r.HeapInuse), mib(r.StackInuse))
	}
	if r.Ready > 0 {
		s += fmt.Sprintf(", ready after %.1f s", r.Ready.Seconds())
	}
	return s
}

// start starts bin with o's GOGC and GOMEMLIMIT and waits until it is ready.
func (m *memoryRun) start(ctx context.Context, bin string, o Options, dir string) (*webhook, time.Duration, error) {
	o.Webhook = bin
	return startReady(ctx, m.ch, o, filepath.Join(o.WorkDir, dir))
}

// idle is bin's memory settle after it is ready.
func (m *memoryRun) idle(ctx context.Context, bin string, o Options, dir string) (memoryReading, error) {
	w, ready, err := m.start(ctx, bin, o, dir)
	if err != nil {
		return memoryReading{}, err
	}
	defer w.stop()
	time.Sleep(settle)
	mem, err := w.memory()
	return memoryReading{memory: mem, Ready: ready}, err
}

// upstream is the upstream example webhook's memory settle after it answers.
func (m *memoryRun) upstream(ctx context.Context, driver string, round int) (memoryReading, error) {
	u, err := startUpstream(ctx, m.o.Upstream, driver, filepath.Join(m.o.WorkDir, fmt.Sprintf("upstream-%d", round)))
	if err != nil {
		return memoryReading{}, err
	}
	defer u.stop()
	time.Sleep(settle)
	mem, err := u.memory()
	return memoryReading{memory: mem}, err
}

// writeClaims writes o.Claims of the published GPUs as held claims (see holder).
func (m *memoryRun) writeClaims(ctx context.Context, cfg *rest.Config, cs kubernetes.Interface, driver string) (*holder, error) {
	devices, err := listDevices(ctx, cs, driver)
	if err != nil {
		return nil, err
	}
	if m.claims, err = claimsFor(m.o.Claims, len(devices)); err != nil {
		return nil, err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.Impersonate = controllerManager
	ccs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	h := &holder{cs: ccs, driver: driver, class: m.ch.classes[0].Name, workers: m.o.Workers, devices: spread(devices), claims: m.claims}
	return h, h.write(ctx)
}

// withClaims measures bin with the claims held: its start as the chart runs it, then the loads
// with o's settings and again as the chart runs it.
func (m *memoryRun) withClaims(ctx context.Context, out io.Writer, bin string, round int, o, asChart Options) error {
	name := filepath.Base(bin)
	restart, err := m.idle(ctx, bin, asChart, fmt.Sprintf("restart-%d", round))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "- round %d %s, started as the chart runs it (GOGC=%s GOMEMLIMIT=%s): %s\n", round+1, name, asChart.GOGC, asChart.GOMemLimit, restart)
	for i, run := range []Options{o, asChart} {
		mem, err := m.loaded(ctx, bin, run, fmt.Sprintf("loaded-%d-%d", round, i))
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "- round %d %s, after the loads (GOGC=%s GOMEMLIMIT=%s): %s\n", round+1, name, run.GOGC, run.GOMemLimit, mem)
	}
	return nil
}

// loaded starts bin, sends template and pod reviews at every claims rate, and reads its memory.
func (m *memoryRun) loaded(ctx context.Context, bin string, o Options, dir string) (memoryReading, error) {
	w, ready, err := m.start(ctx, bin, o, dir)
	if err != nil {
		return memoryReading{}, err
	}
	defer w.stop()
	templates, pods, err := m.ch.reviewers(w, m.l)
	if err != nil {
		return memoryReading{}, err
	}
	var loads []string
	for _, rate := range o.ClaimsRates {
		count := int(o.Duration.Seconds() * float64(rate))
		for _, rv := range []*reviewer{templates, pods} {
			res := drive(ctx, "reviews", rate, count, rv.review)
			loads = append(loads, fmt.Sprintf("%d/s: %d sent, %d failed, p99 %s", rate, res.Sent, res.Failed, ms(res.P99())))
		}
	}
	m.logger.Info("Loads done", "webhook", bin, "loads", strings.Join(loads, "; "))
	time.Sleep(5 * time.Second)
	mem, err := w.memory()
	return memoryReading{memory: mem, Ready: ready}, err
}
