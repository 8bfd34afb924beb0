package scale

import (
	"slices"
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
	round := func(p99 time.Duration) *result {
		r := &result{}
		for range 100 {
			r.Lat = append(r.Lat, p99)
		}
		return r
	}
	rs := []*result{round(9 * time.Millisecond), round(2 * time.Millisecond), round(3 * time.Millisecond)}
	m := median(rs)
	if m != rs[2] || !slices.Equal(m.Rounds, []time.Duration{9 * time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}) {
		t.Errorf("median p99 %s, rounds %v; want the 3 ms round and every round in order", m.P99(), m.Rounds)
	}
}
