package scale

import (
	"context"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	ok := Options{Nodes: []int{1, 100}, Rate: 200, HighRate: 1000, Duration: 10 * time.Second, SchedNodes: 100, SchedPods: 100, Workers: 32, Kwok: "kwok", GOMemLimit: "128MiB", BaselineAssets: "assets",
		Claims: 0.5, ClaimsRates: []int{1000, 2000}, ChurnRate: 100, ReviewDeadline: 100 * time.Millisecond, Upstream: "dra-example-webhook"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid options refused: %v", err)
	}
	off := ok
	off.GOMemLimit, off.Claims, off.ClaimsRates, off.ChurnRate, off.Upstream = "off", 0, nil, 0, ""
	if err := off.Validate(); err != nil {
		t.Fatalf("GOMEMLIMIT off, no claims, no churn, no upstream refused: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Options)
		flag string
	}{
		{"descending", func(o *Options) { o.Nodes = []int{100, 1} }, "--nodes"},
		{"too many nodes", func(o *Options) { o.Nodes = []int{1, maxNodes + 1} }, "--nodes"},
		{"zero rate", func(o *Options) { o.Rate = 0 }, "--rate"},
		{"high rate", func(o *Options) { o.HighRate = maxRate + 1 }, "--high-rate"},
		{"endless", func(o *Options) { o.Duration = time.Hour }, "--duration"},
		{"too many pods", func(o *Options) { o.SchedPods = maxPods + 1 }, "--sched-pods"},
		{"sched size not measured", func(o *Options) { o.SchedNodes = 50 }, "--sched-nodes"},
		{"workers", func(o *Options) { o.Workers = 0 }, "--workers"},
		{"no baseline", func(o *Options) { o.BaselineAssets = "" }, "--baseline-assets"},
		{"memory limit unit", func(o *Options) { o.GOMemLimit = "128M" }, "--webhook-gomemlimit"},
		{"memory limit negative", func(o *Options) { o.GOMemLimit = "-1MiB" }, "--webhook-gomemlimit"},
		{"memory limit huge", func(o *Options) { o.GOMemLimit = strings.Repeat("9", 40) + "MiB" }, "--webhook-gomemlimit"},
		{"memory limit unicode", func(o *Options) { o.GOMemLimit = "１２８MiB" }, "--webhook-gomemlimit"},
		{"claims over 1", func(o *Options) { o.Claims = 1.5 }, "--claims"},
		{"claims negative", func(o *Options) { o.Claims = -0.5 }, "--claims"},
		{"claims NaN", func(o *Options) { o.Claims = math.NaN() }, "--claims"},
		{"claims rate zero", func(o *Options) { o.ClaimsRates = []int{0} }, "--claims-rates"},
		{"claims rate high", func(o *Options) { o.ClaimsRates = []int{1000, maxRate + 1} }, "--claims-rates"},
		{"claims rates many", func(o *Options) { o.ClaimsRates = []int{1, 2, 3, 4, 5} }, "--claims-rates"},
		{"claims without rates", func(o *Options) { o.ClaimsRates = nil }, "--claims-rates"},
		{"upstream without rates", func(o *Options) { o.Claims, o.ClaimsRates = 0, nil }, "--claims-rates"},
		{"churn negative", func(o *Options) { o.ChurnRate = -1 }, "--claims-churn"},
		{"churn high", func(o *Options) { o.ChurnRate = maxChurn + 1 }, "--claims-churn"},
		{"no deadline", func(o *Options) { o.ReviewDeadline = 0 }, "--review-deadline"},
		{"deadline long", func(o *Options) { o.ReviewDeadline = time.Hour }, "--review-deadline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			o.Nodes = append([]int(nil), ok.Nodes...)
			o.ClaimsRates = append([]int(nil), ok.ClaimsRates...)
			tc.edit(&o)
			if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.flag) {
				t.Errorf("error %v, want one naming %s", err, tc.flag)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	r := &result{}
	for i := 1; i <= 200; i++ {
		r.Lat = append(r.Lat, time.Duration(i)*time.Millisecond)
	}
	if r.P50() != 100*time.Millisecond || r.P99() != 198*time.Millisecond || r.percentile(1) != 200*time.Millisecond {
		t.Errorf("p50 %s, p99 %s, max %s", r.P50(), r.P99(), r.percentile(1))
	}
	if (&result{}).P99() != 0 {
		t.Error("no latencies, yet a p99")
	}
}

// TestReadChart: the harness finds in the chart's renders what it installs and the flags it runs
// the webhook with, for every release it runs on.
func TestReadChart(t *testing.T) {
	for _, v := range []string{"1.34", "1.37"} {
		c, err := readChart("../../charts/charttest/testdata/k8s-" + v + ".golden")
		if err != nil {
			t.Fatal(err)
		}
		if c.namespace != "gpu-dra" || !strings.HasSuffix(c.command[0], "gpu-webhook") || len(c.classes) == 0 {
			t.Errorf("%s: namespace %q, command %v, %d classes", v, c.namespace, c.command, len(c.classes))
		}
		if p := c.path(c.validating.Webhooks[0].ClientConfig); p != "/validate-resource-claim" {
			t.Errorf("%s: validating path %q", v, p)
		}
		if p := c.path(c.mutating.Webhooks[0].ClientConfig); p != "/mutate-pod" {
			t.Errorf("%s: mutating path %q", v, p)
		}
		// The chart's limit and GOGC are what a restart's peak is measured with and against.
		if c.memoryLimit != 256<<20 || c.gogc != "400" {
			t.Errorf("%s: memory limit %d, GOGC %q; want the chart's 256Mi and 400", v, c.memoryLimit, c.gogc)
		}
		if q := timeoutQuery(c.validating.Webhooks[0].TimeoutSeconds); q != "?timeout=5s" {
			t.Errorf("%s: template reviews sent with %q, want the configuration's timeoutSeconds as the API server sends it", v, q)
		}
	}
	if _, err := readChart("testdata/node-groups.yaml"); err == nil {
		t.Error("a file with no chart objects was accepted")
	}
}

func TestGroupsSpread(t *testing.T) {
	counts := map[string]int{}
	for i := range 1000 {
		counts[groupOf(i)]++
	}
	if counts[""] != 600 || counts["h200"] != 300 || counts["l4"] != 100 {
		t.Errorf("groups of 1,000 nodes: %v", counts)
	}
}

func TestCompare(t *testing.T) {
	mk := func(p99 time.Duration, steal float64) *result {
		r := &result{Steal: steal}
		for range 100 {
			r.Lat = append(r.Lat, p99)
		}
		return r
	}
	ms := time.Millisecond
	p := func(fleet, base time.Duration, steal float64) pair {
		return pair{fleet: mk(fleet, steal), base: mk(base, 0)}
	}
	busy := func(pr pair, cpu float64) pair { pr.ControlPlane = cpu; return pr }
	for _, tc := range []struct {
		name  string
		pairs []pair
		want  int // index of the median pair
		ratio float64
		quiet int
	}{
		{"all quiet", []pair{p(9*ms, 3*ms, 0), p(2*ms, 2*ms, 1), p(3*ms, 2*ms, 2)}, 2, 1.5, 3},
		{"noisy pairs left out", []pair{p(10*ms, 1*ms, 20), p(4*ms, 2*ms, 0), p(8*ms, 1*ms, 30), p(2*ms, 2*ms, 1), p(3*ms, 2*ms, 2)}, 4, 1.5, 3},
		{"too few quiet: all count", []pair{p(10*ms, 1*ms, 20), p(4*ms, 2*ms, 0), p(3*ms, 2*ms, 30)}, 1, 2, 3},
		{"busy control plane left out", []pair{busy(p(200*ms, 2*ms, 0), 0.6), p(4*ms, 2*ms, 0), busy(p(90*ms, 3*ms, 0), 0.25), p(2*ms, 2*ms, 1), p(3*ms, 2*ms, 2)}, 4, 1.5, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := compare(tc.pairs, baselineLabel)
			if c.Fleet != tc.pairs[tc.want].fleet || c.Base != tc.pairs[tc.want].base || c.Ratio != tc.ratio || c.Quiet != tc.quiet || len(c.Pairs) != len(tc.pairs) {
				t.Errorf("median ratio %.2f (%s / %s) of %d; want pair %d, ratio %.2f of %d", c.Ratio, c.Fleet.P99(), c.Base.P99(), c.Quiet, tc.want, tc.ratio, tc.quiet)
			}
		})
	}
	if enoughQuiet([]pair{p(1, 1, 0), p(1, 1, 5), p(1, 1, 2)}) || !enoughQuiet([]pair{p(1, 1, 0), p(1, 1, 5), p(1, 1, 2), p(1, 1, 2.9)}) {
		t.Error("enoughQuiet: three pairs under 3 % steal")
	}
	if enoughQuiet([]pair{p(1, 1, 0), busy(p(1, 1, 0), 0.3), p(1, 1, 2)}) || !enoughQuiet([]pair{p(1, 1, 0), busy(p(1, 1, 0), 0.24), p(1, 1, 2)}) {
		t.Error("enoughQuiet: three pairs with the control plane under a quarter of a CPU")
	}
	if r := (pair{fleet: mk(1, 0), base: &result{}}).ratio(); r != 0 {
		t.Errorf("ratio without baseline latencies: %v", r)
	}
}

// TestInterleaved: both loads get count calls, in turns of a second (rate calls), the fleet's first.
func TestInterleaved(t *testing.T) {
	var mu sync.Mutex
	var order []byte
	op := func(who byte) func(context.Context, int) error {
		return func(context.Context, int) error {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, who)
			return nil
		}
	}
	p := interleaved(context.Background(), "t", 40, 60, target{review: op('f')}, target{review: op('b')})
	if p.fleet.Sent != 60 || p.base.Sent != 60 || len(p.fleet.Lat) != 60 || len(p.base.Lat) != 60 {
		t.Fatalf("sent %d / %d, latencies %d / %d; want 60 each", p.fleet.Sent, p.base.Sent, len(p.fleet.Lat), len(p.base.Lat))
	}
	if want := strings.Repeat("f", 40) + strings.Repeat("b", 40) + strings.Repeat("f", 20) + strings.Repeat("b", 20); string(order) != want {
		t.Errorf("order %s, want %s", order, want)
	}
	if !slices.IsSorted(p.fleet.Lat) || !slices.IsSorted(p.base.Lat) {
		t.Error("merged latencies not sorted")
	}
}

// TestCollectRarely: during a run the driver collects at driverMemoryLimit only, and afterwards
// the process's GOGC and GOMEMLIMIT are what they were.
func TestCollectRarely(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(150))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(300 << 20))
	restore := collectRarely()
	if got := debug.SetGCPercent(-1); got != -1 {
		t.Errorf("GOGC during a run: %d, want off (-1)", got)
	}
	if got := debug.SetMemoryLimit(-1); got != driverMemoryLimit {
		t.Errorf("GOMEMLIMIT during a run: %d, want %d", got, driverMemoryLimit)
	}
	restore()
	if got := debug.SetGCPercent(-1); got != 150 {
		t.Errorf("GOGC after the run: %d, want 150 as before", got)
	}
	if got := debug.SetMemoryLimit(-1); got != 300<<20 {
		t.Errorf("GOMEMLIMIT after the run: %d, want %d as before", got, 300<<20)
	}
}

// TestCollectAbove: with the collector off, as during a run, garbage past the limit is collected
// when asked, and a heap under it is left alone.
func TestCollectAbove(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	runtime.GC()
	const limit = 32 << 20
	for range 64 {
		garbage = make([]byte, 1<<20)
	}
	garbage = nil
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if !collectAbove(limit) {
		t.Fatalf("64 MiB of garbage over a %d MiB limit: not collected", limit>>20)
	}
	runtime.ReadMemStats(&after)
	if after.NumGC == before.NumGC || after.HeapAlloc > limit {
		t.Errorf("collections %d → %d, heap %d MiB after; want one more and the garbage gone", before.NumGC, after.NumGC, after.HeapAlloc>>20)
	}
	if collectAbove(limit) {
		t.Error("collected again with the heap under the limit")
	}
}

// garbage is where TestCollectAbove makes its garbage, out of the compiler's sight.
var garbage []byte

// TestProcessGroupCPU: a group's share of a CPU is read from the processes' own accounting; this
// test's process, busy on one goroutine, is seen taking as much CPU time as the kernel charged it.
func TestProcessGroupCPU(t *testing.T) {
	comm, _, _, err := readProcStat(strconv.Itoa(os.Getpid()))
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	g := processGroup{pids: []int{os.Getpid()}}
	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	before := g.sample()
	for x, end := 0, time.Now().Add(300*time.Millisecond); time.Now().Before(end); x++ {
		_ = x * x
	}
	share := g.since(before)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	used := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
	elapsed := time.Since(before.at)
	if seen := time.Duration(share * float64(elapsed)); (seen - used).Abs() > 4*ticks(1) {
		t.Errorf("%s (pid %d): %s of CPU time seen, %s charged", comm, os.Getpid(), seen, used)
	}
	if (processGroup{}).since(before) != 0 {
		t.Error("an empty group took CPU time")
	}
}

func TestMemoryOptionsValidate(t *testing.T) {
	ok := MemoryOptions{Webhooks: []string{"a", "b"}, Rounds: 3, GOMemLimits: []string{"", "128MiB"}, Measure: []string{measureIdle, measureChurn}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid options refused: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*MemoryOptions)
		flag string
	}{
		{"no binary", func(mo *MemoryOptions) { mo.Webhooks, mo.GOMemLimits = nil, nil }, "--memory-webhooks"},
		{"no round", func(mo *MemoryOptions) { mo.Rounds = 0 }, "--memory-rounds"},
		{"too many rounds", func(mo *MemoryOptions) { mo.Rounds = maxMemoryRounds + 1 }, "--memory-rounds"},
		{"limits not one per binary", func(mo *MemoryOptions) { mo.GOMemLimits = []string{"128MiB"} }, "--memory-gomemlimits"},
		{"limit unit", func(mo *MemoryOptions) { mo.GOMemLimits = []string{"", "128M"} }, "--memory-gomemlimits"},
		{"unknown measure", func(mo *MemoryOptions) { mo.Measure = []string{"idle", "latency"} }, "--memory-measure"},
		{"empty measure", func(mo *MemoryOptions) { mo.Measure = []string{""} }, "--memory-measure"},
		{"negative node writes", func(mo *MemoryOptions) { mo.NodeWrites = -1 }, "--memory-node-writes"},
		{"too many node writes", func(mo *MemoryOptions) { mo.NodeWrites = maxNodeWrites + 1 }, "--memory-node-writes"},
		{"stall without a length", func(mo *MemoryOptions) { mo.Measure = []string{measureStall} }, "--memory-stall"},
		{"stall too long", func(mo *MemoryOptions) { mo.Measure, mo.Stall = []string{measureStall}, maxStall+1 }, "--memory-stall"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mo := ok
			tc.edit(&mo)
			if err := mo.Validate(); err == nil || !strings.Contains(err.Error(), tc.flag) {
				t.Errorf("error %v, want one naming %s", err, tc.flag)
			}
		})
	}
	if !(MemoryOptions{}).measures(measureClaims) || ok.measures(measureClaims) || !ok.measures(measureChurn) {
		t.Errorf("measures: all when unset, else those named")
	}
}
