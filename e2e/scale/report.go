package scale

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// phase is what was measured at one fleet size.
type phase struct {
	Nodes         int
	Mem, MemAfter memory
	Template, Pod *result
	PodDirect     *result
	High          *result
	Status        time.Duration
	Sched         *schedResult
}

type report struct {
	o       Options
	phases  []*phase
	restart memory
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "\nFleet scale: %s; webhook GOGC=%s, no GOMEMLIMIT; %d GPUs per node\n\n", machine(), r.o.GOGC, nodegroupsCount(r.o.NodeGroups))
	fmt.Fprintf(w, "| nodes | webhook RSS (anonymous) | live heap | templates through the API server, %d/s: p50 / p99 | pods through the API server, %d/s: p50 / p99 | pod reviews straight to the webhook, %d/s: p50 / p99 | template reviews straight to the webhook, %d/s: p50 / p99 | `kubectl dra status` |\n", r.o.Rate, r.o.Rate, r.o.Rate, r.o.HighRate)
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, p := range r.phases {
		high := "—"
		if p.High != nil {
			high = latencies(p.High)
		}
		fmt.Fprintf(w, "| %d | %.1f MiB (%.1f MiB) | %.1f MiB | %s | %s | %s | %s | %.2f s |\n", p.Nodes, mib(p.Mem.RSS), mib(p.Mem.Anon), mib(p.Mem.Live),
			latencies(p.Template), latencies(p.Pod), latencies(p.PodDirect), high, p.Status.Seconds())
	}
	fmt.Fprintln(w)
	for _, p := range r.phases {
		fmt.Fprintf(w, "%d nodes, after the loads: RSS %.1f MiB (anonymous %.1f MiB), live heap %.1f MiB, heap in use %.1f MiB\n", p.Nodes, mib(p.MemAfter.RSS), mib(p.MemAfter.Anon), mib(p.MemAfter.Live), mib(p.MemAfter.HeapInuse))
	}
	for _, p := range r.phases {
		if s := p.Sched; s != nil {
			fmt.Fprintf(w, "\nScheduling at %d nodes: %d annotated pods created at %d/s: %d admitted (p50 %s, p99 %s, webhook not answering %d, failed %d), %d claims allocated after %.1f s, %d Running after %.1f s\n",
				p.Nodes, s.Create.Sent+s.Create.Skipped, s.Create.Rate, s.Admitted, ms(s.Create.P50()), ms(s.Create.P99()), s.Create.Timeouts, s.Create.Failed,
				s.Allocated, s.ToAllocated.Seconds(), s.Run, s.ToRunning.Seconds())
		}
	}
	if last := r.phases[len(r.phases)-1]; r.restart.RSS > 0 {
		fmt.Fprintf(w, "\nThe webhook at %d nodes: peak RSS %.1f MiB over the run (the fleet taken in node by node, and the loads); started with the fleet in place: ready after %.1f s, peak RSS %.1f MiB during the initial lists, %.1f MiB 10 s later (anonymous %.1f MiB, live heap %.1f MiB, heap in use %.1f MiB)\n",
			last.Nodes, mib(last.MemAfter.HWM), r.restart.Synced.Seconds(), mib(r.restart.HWM), mib(r.restart.RSS), mib(r.restart.Anon), mib(r.restart.Live), mib(r.restart.HeapInuse))
	}
	fmt.Fprintln(w)
	for _, p := range r.phases {
		for _, res := range []*result{p.Template, p.Pod, p.PodDirect, p.High} {
			if res != nil {
				fmt.Fprintf(w, "%d nodes: %s\n", p.Nodes, res)
			}
		}
	}
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
