package scale

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// phase is what was measured at one fleet size.
type phase struct {
	Nodes int
	// Fresh is a webhook started at this fleet size; Mem and MemAfter the registered one's
	// before and after this phase's loads.
	Fresh, Mem, MemAfter memory
	Template, Pod        *result
	// PodDirect and High are the loads straight to the webhook, against the baseline's.
	PodDirect, High *comparison
	Status          time.Duration
	Sched           *schedResult
	// Upstream and Claims are measured at the largest fleet only.
	Upstream *upstreamResult
	Claims   *claimsResult
}

type report struct {
	o      Options
	phases []*phase
}

func (r *report) print(w io.Writer) {
	paused := "running"
	if r.o.PauseControllers {
		paused = "paused"
	}
	fmt.Fprintf(w, "\nFleet scale: %s; webhook GOGC=%s, GOMEMLIMIT=%s; %d GPUs per node; controller-manager and scheduler %s during the direct loads\n\n",
		machine(), r.o.GOGC, r.o.GOMemLimit, nodegroupsCount(r.o.NodeGroups), paused)
	fmt.Fprintf(w, "| nodes | webhook RSS, started with the fleet (anonymous) | live heap | RSS of the webhook under load, before this phase's loads | templates through the API server, %d/s: p50 / p99 | pods through the API server, %d/s: p50 / p99 | pod reviews straight to the webhook, %d/s: p50 / p99 (webhook CPU per review, host steal, machine busy); the 1-node baseline webhook's p99 in the same round, interleaved: p99 ratio | template reviews straight to the webhook, %d/s: the same | `kubectl dra status` |\n", r.o.Rate, r.o.Rate, r.o.Rate, r.o.HighRate)
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, p := range r.phases {
		high := "—"
		if p.High != nil {
			high = direct(p.High)
		}
		fmt.Fprintf(w, "| %d | %.1f MiB (%.1f MiB) | %.1f MiB | %.1f MiB | %s | %s | %s | %s | %.2f s |\n", p.Nodes, mib(p.Fresh.RSS), mib(p.Fresh.Anon), mib(p.Fresh.Live), mib(p.Mem.RSS),
			latencies(p.Template), latencies(p.Pod), direct(p.PodDirect), high, p.Status.Seconds())
	}
	fmt.Fprintln(w)
	for _, p := range r.phases {
		fmt.Fprintf(w, "%d nodes: a webhook started with them ready after %.1f s, peak RSS %.1f MiB during the initial lists, %s; the webhook under load after the loads: RSS %.1f MiB (anonymous %.1f MiB), live heap %.1f MiB, heap in use %.1f MiB, peak RSS so far %.1f MiB\n",
			p.Nodes, p.Fresh.Synced.Seconds(), mib(p.Fresh.HWM), settled(p.Fresh), mib(p.MemAfter.RSS), mib(p.MemAfter.Anon), mib(p.MemAfter.Live), mib(p.MemAfter.HeapInuse), mib(p.MemAfter.HWM))
	}
	for _, p := range r.phases {
		if s := p.Sched; s != nil {
			fmt.Fprintf(w, "\nScheduling at %d nodes: %d annotated pods created at %d/s: %d admitted (p50 %s, p99 %s, webhook not answering %d, failed %d), %d claims allocated after %.1f s, %d Running after %.1f s\n",
				p.Nodes, s.Create.Sent+s.Create.Skipped, s.Create.Rate, s.Admitted, ms(s.Create.P50()), ms(s.Create.P99()), s.Create.Timeouts, s.Create.Failed,
				s.Allocated, s.ToAllocated.Seconds(), s.Run, s.ToRunning.Seconds())
		}
	}
	for _, p := range r.phases {
		if p.Upstream != nil {
			printUpstream(w, p.Nodes, p.Upstream)
		}
		if p.Claims != nil {
			printClaims(w, p.Nodes, r.o, p.Claims)
		}
	}
	fmt.Fprintln(w)
	for _, p := range r.phases {
		for _, res := range []*result{p.Template, p.Pod} {
			fmt.Fprintf(w, "%d nodes: %s\n", p.Nodes, res)
		}
		for _, c := range p.comparisons() {
			fmt.Fprintf(w, "%d nodes: %s: %s\n", p.Nodes, c.Fleet, c)
		}
		if c := p.Claims; c != nil && c.Churn != nil {
			fmt.Fprintf(w, "%d nodes, %d claims: %s\n%d nodes, %d claims: %s\n", p.Nodes, c.Claims, c.Churn.Changes, p.Nodes, c.Claims, c.Churn.Reviews)
		}
	}
}

// comparisons are every load of the phase compared with another webhook.
func (p *phase) comparisons() []*comparison {
	out := []*comparison{p.PodDirect, p.High}
	if p.Upstream != nil {
		out = append(out, p.Upstream.Templates...)
	}
	if p.Claims != nil {
		out = append(append(out, p.Claims.Templates...), p.Claims.Pods...)
	}
	return slices.DeleteFunc(out, func(c *comparison) bool { return c == nil })
}

// printUpstream is our webhook against the upstream example webhook: p99 and RSS ratios.
func printUpstream(w io.Writer, nodes int, u *upstreamResult) {
	fmt.Fprintf(w, "\nAt %d nodes, no claims held: ours against %s (the same template AdmissionReviews, straight to each, interleaved)\n", nodes, upstreamLabel)
	for _, c := range u.Templates {
		fmt.Fprintf(w, "- template reviews at %d/s: p99 %s against %s: ×%.2f (median of %d of %d rounds; webhook CPU per review %s against %s)\n",
			c.Fleet.Rate, ms(c.Fleet.P99()), ms(c.Base.P99()), c.Ratio, c.Quiet, len(c.Pairs), us(c.Fleet.CPU), us(c.Base.CPU))
	}
	fmt.Fprintf(w, "- RSS after those loads: ours %.1f MiB, upstream %.1f MiB: ×%.2f\n", mib(u.Ours.RSS), mib(u.Theirs.RSS), ratio(u.Ours.RSS, u.Theirs.RSS))
	fmt.Fprintf(w, "- RSS without a load, %.0f s after ready: ours (one started with the fleet) %.1f MiB, upstream %.1f MiB: ×%.2f (ours: %s)\n",
		settle.Seconds(), mib(u.Fresh.RSS), mib(u.TheirsIdle.RSS), ratio(u.Fresh.RSS, u.TheirsIdle.RSS), settled(u.Fresh))
}

// settled is a started webhook's memory once it settled, and what went on until it was read.
func settled(m memory) string {
	s := fmt.Sprintf("%.0f s after ready RSS %.1f MiB (anonymous %.1f, heap in use %.1f, stacks %.1f)",
		settle.Seconds(), mib(m.RSS), mib(m.Anon), mib(m.HeapInuse), mib(m.StackInuse))
	if m.Meanwhile != nil {
		s += "; " + m.Meanwhile.String()
	}
	return s
}

// printClaims is the largest fleet with the held claims in place.
func printClaims(w io.Writer, nodes int, o Options, c *claimsResult) {
	fmt.Fprintf(w, "\nAt %d nodes with %d allocated claims (%.0f %% of %d GPUs, one each, spread over the nodes and %d namespaces; written in %.1f s)\n",
		nodes, c.Claims, 100*o.Claims, c.Devices, min(c.Claims, claimNamespaces), c.Written.Seconds())
	fmt.Fprintf(w, "- webhook RSS: the registered one %.1f MiB (anonymous %.1f MiB, live heap %.1f MiB); one started with the claims %.1f MiB, peak %.1f MiB, ready after %.1f s\n",
		mib(c.Mem.RSS), mib(c.Mem.Anon), mib(c.Mem.Live), mib(c.Fresh.RSS), mib(c.Fresh.HWM), c.Fresh.Synced.Seconds())
	if c.Limit > 0 {
		fmt.Fprintf(w, "- a restart as the chart runs it (its GOGC, GOMEMLIMIT at its memory limit): peak RSS %.1f MiB of the %.0f MiB limit, %.0f %% to spare\n",
			mib(c.Restart.HWM), mib(c.Limit), 100*(1-float64(c.Restart.HWM)/float64(c.Limit)))
	}
	for i, t := range c.Templates {
		fmt.Fprintf(w, "- template reviews straight to the webhook at %d/s: %s\n", t.Fleet.Rate, direct(t))
		fmt.Fprintf(w, "- pod reviews straight to the webhook at %d/s: %s\n", c.Pods[i].Fleet.Rate, direct(c.Pods[i]))
	}
	if ch := c.Churn; ch != nil {
		r := ch.Reviews
		fmt.Fprintf(w, "- claims churn: %d allocation changes at %d/s (%d failed), template reviews at %d/s meanwhile: p50 %s, p99 %s, max %s; over the %s deadline: %d of %d answered, %d failed\n",
			ch.Changes.Sent, ch.Changes.Rate, ch.Changes.Failed, r.Rate, ms(r.P50()), ms(r.P99()), ms(r.percentile(1)), ch.Deadline, ch.Over, len(r.Lat), r.Failed)
		if ch.Over > 0 {
			fmt.Fprintf(w, "  - over the deadline, by second of the load: %v\n", overBySecond(r, ch.Deadline))
		}
	}
	if c.CLI != nil {
		printCLITimes(w, c.CLI)
	}
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// direct is a load straight to the webhook: p50 / p99, its CPU per review and the host's steal,
// and its p99 against the baseline webhook's in the same round.
func direct(c *comparison) string {
	r := c.Fleet
	return fmt.Sprintf("%s (%s, steal %.0f%%, busy %.0f%%); baseline %s: ×%.2f, median of %d of %d rounds",
		latencies(r), us(r.CPU), r.Steal, r.Busy, ms(c.Base.P99()), c.Ratio, c.Quiet, len(c.Pairs))
}

func latencies(r *result) string {
	s := fmt.Sprintf("%s / %s", ms(r.P50()), ms(r.P99()))
	if r.Failed > 0 || r.Skipped > 0 {
		s += fmt.Sprintf(" (%d failed, %d skipped)", r.Failed, r.Skipped)
	}
	return s
}

// machine describes where the run happened: CPUs, memory, load.
func machine() string {
	mem := ""
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(strings.SplitN(string(data), "\n", 2)[0], "MemTotal: %d kB", &kb); err == nil {
			mem = fmt.Sprintf(", %.0f GiB", float64(kb)/(1<<20))
		}
	}
	load := ""
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = ", load " + strings.Join(strings.Fields(string(data))[:3], " ")
	}
	return fmt.Sprintf("%d CPUs%s%s", runtime.NumCPU(), mem, load)
}

func nodegroupsCount(path string) int {
	cfg, err := nodegroups.LoadConfig(path)
	if err != nil {
		return 0
	}
	return cfg.MaxDevicesPerNode()
}
