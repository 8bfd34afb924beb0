package scale

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The full run times kubectl dra status and why with the claims in place, after the loads. The
// loads end with the churn's last changes reaching every watcher, the registered webhook among
// them; a command timed in those seconds measures that catching up as much as the command. So the
// commands wait for the machine to settle, boundedly, then run cliRounds times each, and each run
// says which other processes took CPU meanwhile. The controllers stay paused, as for the direct
// loads and for the same reason: the fake nodes never report Ready and the node lifecycle
// controller keeps writing to them, and meanwhile the scheduler tried the pending pod of why again
// every second or so, each time searching the whole fleet for it (0.4–1.6 s of the scheduler's
// CPU during each run of about 2 s when they ran).
const (
	cliRounds = 3
	// quietBusy is the share of the machine's CPU, over settleWindow, below which it counts as
	// settled; settleMax bounds the wait, after which the commands run anyway and say so.
	quietBusy    = 50.0
	settleWindow = 2 * time.Second
	settleMax    = 60 * time.Second
)

// cliCommands are the commands timed: status, and why on the pending pod (createPendingPod).
var cliCommands = [][]string{{"status"}, {"why", "pod/" + whyPod, "-n", loadNamespace}}

// cliTimes is status and why, cliRounds runs each, once the machine settled.
type cliTimes struct {
	// Waited is how long the machine took to settle, Busy its share of CPU busy in the last
	// window before the commands; Settled is false when settleMax ran out first.
	Waited  time.Duration
	Busy    float64
	Settled bool
	// Paused: the controller-manager and the scheduler were paused meanwhile.
	Paused      bool
	Status, Why []cliRun
}

// medians are the median wall times of status and why; zero for a nil ct (nothing timed).
func (ct *cliTimes) medians() (status, why time.Duration) {
	if ct == nil {
		return 0, 0
	}
	return medianWall(ct.Status), medianWall(ct.Why)
}

// waitQuiet waits until the machine's busy share over one window is below quietBusy, or maxWait
// passed. sample reads the machine's CPU accounting (sampleCPU with no process, in a run).
func waitQuiet(ctx context.Context, sample func() (cpuSample, error), window, maxWait time.Duration) (waited time.Duration, busy float64, settled bool, err error) {
	start := time.Now()
	for {
		a, err := sample()
		if err != nil {
			return 0, 0, false, err
		}
		select {
		case <-ctx.Done():
			return 0, 0, false, ctx.Err()
		case <-time.After(window):
		}
		b, err := sample()
		if err != nil {
			return 0, 0, false, err
		}
		busy = busyPercent(a, b)
		waited = time.Since(start)
		if busy < quietBusy {
			return waited, busy, true, nil
		}
		if waited >= maxWait {
			return waited, busy, false, nil
		}
	}
}

// timeCLISettled waits for the machine to settle, then times cliCommands cliRounds times each,
// alternating.
func (r *runner) timeCLISettled(ctx context.Context) (*cliTimes, error) {
	ct := &cliTimes{Paused: r.o.PauseControllers}
	if ct.Paused {
		defer pauseControllers(r.logger)()
	}
	var err error
	if ct.Waited, ct.Busy, ct.Settled, err = waitQuiet(ctx, func() (cpuSample, error) { return sampleCPU(0) }, settleWindow, settleMax); err != nil {
		return nil, err
	}
	runs := [][]cliRun{nil, nil}
	for range cliRounds {
		for c, args := range cliCommands {
			run, err := runKubectlDraAmong(ctx, r.o, args...)
			if err != nil {
				return nil, err
			}
			runs[c] = append(runs[c], run)
		}
	}
	ct.Status, ct.Why = runs[0], runs[1]
	return ct, nil
}

// runKubectlDraAmong is runKubectlDra that also notes the processes that used the most CPU
// while the command ran.
func runKubectlDraAmong(ctx context.Context, o Options, args ...string) (cliRun, error) {
	before, _ := processes() // without a process table, nothing is named
	r, err := runKubectlDra(ctx, o, args...)
	after, _ := processes()
	r.Others = topCPU(before, after, 3)
	return r, err
}

// process is one running process: its command name (the kernel cuts it at 15 bytes), parent and
// user+system clock ticks.
type process struct {
	comm, ppid string
	ticks      int64
}

// processes is every running process by pid.
func processes() (map[string]process, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	by := map[string]process{}
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue // not a process: also /proc/self, which would count the caller twice
		}
		if comm, ppid, ticks, err := readProcStat(p.Name()); err == nil { // else gone meanwhile
			by[p.Name()] = process{comm, ppid, ticks}
		}
	}
	return by, nil
}

// topCPU names the n commands whose processes' CPU time grew most from a to b, with how much:
// "name 0.52 s, ...". A process is told by its pid, not its name, which a kernel worker changes
// with the work it does; it is named as in b. One that started meanwhile counts whole, one that
// ended meanwhile is not in b and is left out.
func topCPU(a, b map[string]process, n int) string {
	byName := map[string]int64{}
	for pid, p := range b {
		if d := p.ticks - a[pid].ticks; d > 0 {
			byName[p.comm] += d
		}
	}
	type use struct {
		name  string
		ticks int64
	}
	var uses []use
	for name, t := range byName {
		uses = append(uses, use{name, t})
	}
	slices.SortFunc(uses, func(x, y use) int {
		return cmp.Or(cmp.Compare(y.ticks, x.ticks), strings.Compare(x.name, y.name))
	})
	var parts []string
	for _, u := range uses[:min(n, len(uses))] {
		parts = append(parts, fmt.Sprintf("%s %.2f s", u.name, ticks(u.ticks).Seconds()))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// medianWall is the median wall time of runs (the upper one of an even count).
func medianWall(runs []cliRun) time.Duration {
	if len(runs) == 0 {
		return 0
	}
	return slices.Sorted(slices.Values(walls(runs)))[len(runs)/2]
}

// walls is each run's wall time, in order.
func walls(runs []cliRun) []time.Duration {
	ws := make([]time.Duration, len(runs))
	for i, r := range runs {
		ws[i] = r.Wall
	}
	return ws
}

// printCLITimes is the report's lines for ct.
func printCLITimes(w io.Writer, ct *cliTimes) {
	state := fmt.Sprintf("the machine settled after %.0f s (busy %.0f %% over %s)", ct.Waited.Seconds(), ct.Busy, settleWindow)
	if !ct.Settled {
		state = fmt.Sprintf("the machine still busy after %.0f s (%.0f %% over %s), run anyway", ct.Waited.Seconds(), ct.Busy, settleWindow)
	}
	if ct.Paused {
		state += ", the controller-manager and the scheduler paused"
	}
	fmt.Fprintf(w, "- `kubectl dra status` and `kubectl dra why pod/%s` (all GPUs of one node, which no node has free), %s, %d runs each:\n", whyPod, state, len(ct.Status))
	for _, c := range []struct {
		name string
		runs []cliRun
	}{{"status", ct.Status}, {"why", ct.Why}} {
		fmt.Fprintf(w, "  - %s: %s", c.name, secondsRange(walls(c.runs)))
		for i, r := range c.runs {
			fmt.Fprintf(w, "; run %d %.2f s (its CPU %.2f s; meanwhile %s)", i+1, r.Wall.Seconds(), r.CPU.Seconds(), r.Others)
		}
		fmt.Fprintln(w)
	}
}
