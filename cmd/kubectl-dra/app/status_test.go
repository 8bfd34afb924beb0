package app

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
)

const (
	statusBasic  = "testdata/status/basic.yaml"
	statusShared = "testdata/status/shared.yaml"
	whyCluster   = "testdata/why/cluster.yaml"
	whyBusy      = "testdata/why/busy.yaml"
)

// statusCases run `kubectl dra status` on hand-made cluster states; stdout and stderr are golden.
var statusCases = []struct {
	name  string
	state string
	args  []string
	code  int
}{
	{name: "basic", state: statusBasic},
	{name: "basic-wide", state: statusBasic, args: []string{"-o", "wide"}},
	{name: "basic-json", state: statusBasic, args: []string{"-o", "json"}},
	{name: "basic-yaml", state: statusBasic, args: []string{"-o", "yaml"}},
	{name: "basic-node", state: statusBasic, args: []string{"--node", "las2"}},
	{name: "basic-selector", state: statusBasic, args: []string{"-l", "gpu.example.com/group=latest"}},
	{name: "basic-no-such-node", state: statusBasic, args: []string{"-l", "gpu.example.com/group=none"}},
	{name: "basic-other-driver", state: statusBasic, args: []string{"--driver-name", "nic.example.com"}},
	{name: "shared", state: statusShared},
	{name: "shared-wide", state: statusShared, args: []string{"-o", "wide"}},
	{name: "shared-json", state: statusShared, args: []string{"-o", "json"}},
	{name: "busy-wide", state: whyBusy, args: []string{"-o", "wide"}},
	{name: "bad-output", state: statusBasic, args: []string{"-o", "table"}, code: ExitFailed},
}

func TestStatusGolden(t *testing.T) {
	noCluster(t)
	for _, tc := range statusCases {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, "", append([]string{"status", "--cluster-state", tc.state}, tc.args...)...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", r.code, tc.code, r.stderr)
			}
			golden(t, "testdata/status/golden/"+tc.name+".stdout", r.stdout)
			golden(t, "testdata/status/golden/"+tc.name+".stderr", r.stderr)
		})
	}
}

// statusReport runs status -o json on a state file.
func statusReport(t *testing.T, state string, args ...string) deviceusage.Report {
	t.Helper()
	r := run(t, "", append([]string{"status", "--cluster-state", state, "-o", "json"}, args...)...)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var rep deviceusage.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("-o json: %v\n%s", err, r.stdout)
	}
	return rep
}

func findDevice(t *testing.T, rep deviceusage.Report, node, name string) *deviceusage.Device {
	t.Helper()
	for _, n := range rep.Nodes {
		for _, d := range n.Devices {
			if n.Name == node && d.Name == name {
				return d
			}
		}
	}
	t.Fatalf("device %s/%s not in the report", node, name)
	return nil
}

// TestStatusFacts states what the golden files must show, so that rewriting them with -update
// cannot bless a wrong answer.
func TestStatusFacts(t *testing.T) {
	noCluster(t)
	rep := statusReport(t, statusBasic)
	seed := findDevice(t, rep, "las1", "gpu-0")
	if seed.State != deviceusage.StateAllocated || len(seed.Allocations) != 2 || seed.Allocations[0].Claim != "default/seed-gpu-8pwzt" ||
		!slices.Equal(seed.Allocations[0].Pods, []string{"default/seed"}) || !seed.Allocations[1].AdminAccess {
		t.Errorf("las1/gpu-0: %+v, want allocated to default/seed-gpu-8pwzt for pod default/seed, plus an admin-access watcher", seed)
	}
	if d := findDevice(t, rep, "las1", "gpu-7"); d.Healthy || d.State != deviceusage.StateFree || len(d.Taints) != 1 || d.Taints[0].Rule != "" {
		t.Errorf("las1/gpu-7: %+v, want unhealthy and free with the driver's taint", d)
	}
	if d := findDevice(t, rep, "las2", "gpu-3"); d.Healthy || len(d.Taints) != 1 || d.Taints[0].Rule != "las2-gpu-3-maintenance" {
		t.Errorf("las2/gpu-3: %+v, want the DeviceTaintRule's taint", d)
	}
	wantTotals := []deviceusage.Total{
		{Driver: "gpu.example.com", Model: "LATEST-GPU-MODEL", Devices: 8, Free: 4, Allocated: 3, Unhealthy: 1},
		{Driver: "gpu.example.com", Model: "OLD-GPU-MODEL", Devices: 4, Free: 3, Unhealthy: 1},
	}
	if !slices.Equal(rep.Totals, wantTotals) {
		t.Errorf("totals %+v, want %+v", rep.Totals, wantTotals)
	}
	if !slices.Equal(rep.Pending, []string{"team-a/big-gpus-2fj8s"}) {
		t.Errorf("pending %v", rep.Pending)
	}

	rep = statusReport(t, statusShared)
	if d := findDevice(t, rep, "las3", "gpu-0"); d.State != deviceusage.StateBlocked || !slices.Equal(d.CountersShort, []string{"gpu-0-counters"}) {
		t.Errorf("las3/gpu-0: %+v, want blocked by gpu-0-counters", d)
	}
	if d := findDevice(t, rep, "las3", "gpu-0-half-1"); d.State != deviceusage.StateFree {
		t.Errorf("las3/gpu-0-half-1: %s, want free", d.State)
	}
	shared := findDevice(t, rep, "las3", "gpu-1")
	if used := shared.Consumed["memory"]; shared.State != deviceusage.StateShared || len(shared.Allocations) != 2 || used.String() != "50Gi" {
		t.Errorf("las3/gpu-1: %+v, want shared by two claims using 50Gi", shared)
	}
	if len(rep.Unpublished) != 1 || rep.Unpublished[0].Device != "gpu.example.com/las9/gpu-0" {
		t.Errorf("unpublished %+v", rep.Unpublished)
	}
	if len(rep.CounterSets) != 1 || counterUsed(rep.CounterSets[0], "memory") != "40Gi" {
		t.Errorf("counter sets %+v", rep.CounterSets)
	}

	// -l and --node: las1's devices only, by label or by name.
	for _, args := range [][]string{{"-l", "gpu.example.com/group=latest"}, {"--node", "las1"}} {
		rep = statusReport(t, statusBasic, args...)
		if len(rep.Nodes) != 1 || rep.Nodes[0].Name != "las1" {
			t.Errorf("%s: nodes %+v", strings.Join(args, " "), rep.Nodes)
		}
	}
}

func counterUsed(cs *deviceusage.CounterSet, name string) string {
	c := cs.Counters[name]
	return c.Used.String()
}

// countingWriter counts the writes that reach it.
type countingWriter struct {
	strings.Builder
	writes int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes++
	return w.Builder.Write(p)
}

// TestStatusWritesBuffered: the device table reaches standard output in a few writes, not one per
// cell, which on a fleet of 40,000 devices cost a third of the command's CPU in system calls.
func TestStatusWritesBuffered(t *testing.T) {
	out := &countingWriter{}
	o := &statusOptions{streams: genericiooptions.IOStreams{Out: out, ErrOut: &strings.Builder{}}, clusterStateFile: statusBasic,
		driverName: deviceschema.DefaultDriverName}
	if err := o.run(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Count(out.String(), "\n")
	if lines < 10 || out.writes > 2 {
		t.Errorf("%d lines in %d writes, want them in at most 2", lines, out.writes)
	}
}
