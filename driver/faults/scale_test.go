package faults

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestConfigMapSourceReceivesOnlyItsNode injects one fault per node into fleets of 10 and 1,000
// nodes, runs the plugins of two nodes, and changes the fault of the first: the first plugin
// receives that one object, of the same size whatever the fleet's, and the second receives
// nothing. Before and after the change each plugin has received only its own node's object.
func TestConfigMapSourceReceivesOnlyItsNode(t *testing.T) {
	var perChange []int
	for _, nodes := range []int{10, 1000} {
		t.Run(fmt.Sprintf("%d nodes", nodes), func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			f := newFleet()
			cms := f.writer.CoreV1().ConfigMaps("gpu-dra")
			for i := range nodes {
				node := fmt.Sprintf("node-%d", i)
				if err := f.writer.Tracker().Add(NewObject("gpu-dra", "gpu-dra-faults", node, entry("XID 79"), nil)); err != nil {
					t.Fatal(err)
				}
			}
			a := runPlugin(ctx, t, f, "node-0")
			b := runPlugin(ctx, t, f, "node-1")
			waitFor(t, func() bool {
				return a.tracker.Faults()["gpu-1"].Message == "XID 79" && b.tracker.Faults()["gpu-1"].Message == "XID 79"
			})
			aObjects, aBytes, _ := a.received.snapshot()
			bObjects, _, _ := b.received.snapshot()
			if aObjects != 1 || bObjects != 1 {
				t.Errorf("the plugins' first lists returned %d and %d objects, want each only its node's", aObjects, bObjects)
			}

			cm := NewObject("gpu-dra", "gpu-dra-faults", "node-0", entry("XID 48"), nil)
			if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, func() bool { return a.tracker.Faults()["gpu-1"].Message == "XID 48" })
			time.Sleep(200 * time.Millisecond) // what else would reach b has reached it by now
			objects, bytes, names := a.received.snapshot()
			if objects-aObjects != 1 {
				t.Errorf("node-0's plugin received %d objects for one change (%v), want 1", objects-aObjects, names)
			}
			perChange = append(perChange, bytes-aBytes)
			if n, _, names := b.received.snapshot(); n != bObjects {
				t.Errorf("node-1's plugin received %v for node-0's change, want nothing", names[bObjects:])
			}
			t.Logf("%d nodes: one change sends %d bytes (JSON) to its node's plugin", nodes, bytes-aBytes)
		})
	}
	if len(perChange) == 2 && perChange[0] != perChange[1] {
		t.Errorf("bytes per change grow with the fleet: %d with 10 nodes, %d with 1,000", perChange[0], perChange[1])
	}
}

type runningPlugin struct {
	tracker  *Tracker
	received *received
}

// runPlugin runs node's source against f and returns once it watches.
func runPlugin(ctx context.Context, t *testing.T, f *fleet, node string) runningPlugin {
	t.Helper()
	cs, r := f.plugin()
	tr := NewTracker(&ConfigMapSource{Client: cs, Namespace: "gpu-dra", Name: "gpu-dra-faults", NodeName: node})
	go func() { _ = tr.Run(ctx) }()
	waitFor(t, func() bool { return r.watches() > 0 })
	return runningPlugin{tracker: tr, received: r}
}

// entry is a node's entry with a fault on gpu-1.
func entry(message string) string {
	return fmt.Sprintf("gpu-1: {kind: xid, time: \"2026-12-03T10:00:00Z\", message: %s}\n", message)
}
