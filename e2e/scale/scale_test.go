package scale

import (
	"strings"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	ok := Options{Nodes: []int{1, 100}, Rate: 200, HighRate: 1000, Duration: 10 * time.Second, SchedNodes: 100, SchedPods: 100, Workers: 32, Kwok: "kwok", GOMemLimit: "128MiB"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid options refused: %v", err)
	}
	off := ok
	off.GOMemLimit = "off"
	if err := off.Validate(); err != nil {
		t.Fatalf("GOMEMLIMIT off refused: %v", err)
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
		{"memory limit unit", func(o *Options) { o.GOMemLimit = "128M" }, "--webhook-gomemlimit"},
		{"memory limit negative", func(o *Options) { o.GOMemLimit = "-1MiB" }, "--webhook-gomemlimit"},
		{"memory limit huge", func(o *Options) { o.GOMemLimit = strings.Repeat("9", 40) + "MiB" }, "--webhook-gomemlimit"},
		{"memory limit unicode", func(o *Options) { o.GOMemLimit = "１２８MiB" }, "--webhook-gomemlimit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			o.Nodes = append([]int(nil), ok.Nodes...)
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

func TestMedian(t *testing.T) {
	mk := func(p99 time.Duration, steal float64) *result {
		r := &result{Steal: steal}
		for range 100 {
			r.Lat = append(r.Lat, p99)
		}
		return r
	}
	for _, tc := range []struct {
		name   string
		rounds []*result
		want   int // index of the median round
		quiet  int
	}{
		{"all quiet", []*result{mk(9*time.Millisecond, 0), mk(2*time.Millisecond, 1), mk(3*time.Millisecond, 2)}, 2, 3},
		{"noisy rounds left out", []*result{mk(1*time.Millisecond, 20), mk(9*time.Millisecond, 0), mk(8*time.Millisecond, 30), mk(2*time.Millisecond, 1), mk(3*time.Millisecond, 2)}, 4, 3},
		{"too few quiet: all count", []*result{mk(1*time.Millisecond, 20), mk(9*time.Millisecond, 0), mk(5*time.Millisecond, 30)}, 2, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := median(tc.rounds)
			if m != tc.rounds[tc.want] || m.Quiet != tc.quiet || len(m.Rounds) != len(tc.rounds) {
				t.Errorf("median p99 %s of %d (rounds %v); want round %d of %d", m.P99(), m.Quiet, m.Rounds, tc.want, tc.quiet)
			}
			for i, r := range m.Rounds {
				if r.P99 != tc.rounds[i].P99() || r.Steal != tc.rounds[i].Steal {
					t.Errorf("round %d: %+v", i, r)
				}
			}
		})
	}
	if enoughQuiet([]*result{mk(1, 0), mk(1, 5), mk(1, 2)}) || !enoughQuiet([]*result{mk(1, 0), mk(1, 5), mk(1, 2), mk(1, 2.9)}) {
		t.Error("enoughQuiet: three rounds under 3 % steal")
	}
}
