package scale

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// samples returns a sampler whose windows, two samples each, are busy by the given shares in turn.
func samples(busy ...float64) func() (cpuSample, error) {
	var s cpuSample
	i := 0
	return func() (cpuSample, error) {
		if i/2 >= len(busy) {
			return s, errors.New("sampled past the end")
		}
		if i%2 == 1 {
			s.total += 100
			s.idle += int64(100 - busy[i/2])
		}
		i++
		return s, nil
	}
}

func TestWaitQuiet(t *testing.T) {
	for _, tc := range []struct {
		name        string
		busy        []float64
		maxWait     time.Duration
		wantBusy    float64
		wantSettled bool
	}{
		{name: "quiet at once", busy: []float64{10}, maxWait: time.Second, wantBusy: 10, wantSettled: true},
		{name: "quiet after two busy windows", busy: []float64{90, 70, 49}, maxWait: time.Second, wantBusy: 49, wantSettled: true},
		{name: "at the line is not quiet", busy: []float64{50, 20}, maxWait: time.Second, wantBusy: 20, wantSettled: true},
		{name: "never quiet: gives up after maxWait", busy: []float64{95, 95, 95}, maxWait: 0, wantBusy: 95, wantSettled: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, busy, settled, err := waitQuiet(context.Background(), samples(tc.busy...), time.Millisecond, tc.maxWait)
			if err != nil {
				t.Fatal(err)
			}
			if busy != tc.wantBusy || settled != tc.wantSettled {
				t.Errorf("busy %.0f settled %v, want %.0f %v", busy, settled, tc.wantBusy, tc.wantSettled)
			}
		})
	}
	t.Run("sampling fails", func(t *testing.T) {
		if _, _, _, err := waitQuiet(context.Background(), samples(), time.Millisecond, time.Second); err == nil {
			t.Error("no error")
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, _, _, err := waitQuiet(ctx, samples(90), time.Hour, time.Hour); !errors.Is(err, context.Canceled) {
			t.Errorf("err %v, want context.Canceled", err)
		}
	})
}

func TestTopCPU(t *testing.T) {
	a := map[string]process{
		"10": {comm: "kube-apiserver", ticks: 1000}, "11": {comm: "etcd", ticks: 500}, "12": {comm: "gpu-webhook", ticks: 300}, "13": {comm: "idle", ticks: 7},
		"20": {comm: "kworker/u8:2-events", ticks: 900}, "21": {comm: "kworker/0:1-events", ticks: 100}, "30": {comm: "gone", ticks: 50},
	}
	b := map[string]process{
		"10": {comm: "kube-apiserver", ticks: 1052}, "11": {comm: "etcd", ticks: 510}, "12": {comm: "gpu-webhook", ticks: 330}, "13": {comm: "idle", ticks: 7},
		// A kernel worker renamed by its work counts what it did meanwhile, not all it ever did.
		"20": {comm: "kworker/u8:2-writeback", ticks: 904},
		"21": {comm: "kworker/0:1-events", ticks: 101},
		// Started meanwhile: all of it.
		"40": {comm: "new", ticks: 10},
		// Two processes of one name add up.
		"41": {comm: "etcd", ticks: 5},
	}
	for _, tc := range []struct {
		n    int
		want string
	}{
		{3, "kube-apiserver 0.52 s, gpu-webhook 0.30 s, etcd 0.15 s"},
		{6, "kube-apiserver 0.52 s, gpu-webhook 0.30 s, etcd 0.15 s, new 0.10 s, kworker/u8:2-writeback 0.04 s, kworker/0:1-events 0.01 s"},
		{1, "kube-apiserver 0.52 s"},
	} {
		if got := topCPU(a, b, tc.n); got != tc.want {
			t.Errorf("topCPU(n=%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
	if got := topCPU(a, a, 3); got != "none" {
		t.Errorf("nothing moved: %q", got)
	}
}

func TestProcesses(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skipf("no /proc here (%v): processes reads Linux's process table", err)
	}
	self, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	procs, err := processes()
	if err != nil {
		t.Fatal(err)
	}
	for _, notPID := range []string{"self", "thread-self"} {
		if _, ok := procs[notPID]; ok {
			t.Errorf("/proc/%s is taken for a process: the caller would count twice", notPID)
		}
	}
	p, ok := procs[strconv.Itoa(os.Getpid())]
	if !ok || p.comm != strings.TrimSpace(string(self)) || p.ppid != strconv.Itoa(os.Getppid()) {
		t.Errorf("this process: %+v (found %v), want the name %q and the parent %d", p, ok, strings.TrimSpace(string(self)), os.Getppid())
	}
}

func TestMedianWallAndReport(t *testing.T) {
	runs := []cliRun{{Wall: 3 * time.Second}, {Wall: time.Second, Others: "kube-apiserver 0.40 s"}, {Wall: 2 * time.Second}}
	if got := medianWall(runs); got != 2*time.Second {
		t.Errorf("median %s, want 2s", got)
	}
	if got := medianWall(nil); got != 0 {
		t.Errorf("median of none %s", got)
	}
	if s, w := (&cliTimes{Status: runs, Why: runs[:1]}).medians(); s != 2*time.Second || w != 3*time.Second {
		t.Errorf("medians %s, %s, want 2s, 3s", s, w)
	}
	if s, w := (*cliTimes)(nil).medians(); s != 0 || w != 0 {
		t.Errorf("medians of nothing timed: %s, %s", s, w)
	}
	var out strings.Builder
	printCLITimes(&out, &cliTimes{Waited: 6 * time.Second, Busy: 30, Settled: true, Status: runs, Why: runs})
	for _, want := range []string{"settled after 6 s (busy 30 %", "status: 1.00 / 2.00 / 3.00 s", "run 2 1.00 s (its CPU 0.00 s; meanwhile kube-apiserver 0.40 s)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	printCLITimes(&out, &cliTimes{Waited: time.Minute, Busy: 80, Status: runs, Why: runs})
	if !strings.Contains(out.String(), "still busy after 60 s (80 %") || strings.Contains(out.String(), "paused") {
		t.Errorf("an unsettled machine is not said, or paused controllers are said where none were:\n%s", out.String())
	}
	out.Reset()
	printCLITimes(&out, &cliTimes{Paused: true, Settled: true, Status: runs, Why: runs})
	if !strings.Contains(out.String(), "the controller-manager and the scheduler paused") {
		t.Errorf("paused controllers are not said:\n%s", out.String())
	}
}
