package faults

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

const good = "gpu-1: {kind: xid, time: \"2026-12-03T10:00:00Z\", message: XID 79}\n"

// TestConfigMapSource runs the source against a fake API server through a sequence of writes to
// the node's own ConfigMap: good entries reach the node, bad ones (unknown device, unknown kind,
// garbage) are logged with their key and change nothing, other keys are ignored, and deleting the
// object clears. The single ConfigMap of earlier versions (the anchor, with entries) is ignored.
func TestConfigMapSource(t *testing.T) {
	logger, buf := newLogger(t)
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), logger))
	defer cancel()
	fleet := newFleet()
	cs, received := fleet.plugin()
	cms := fleet.writer.CoreV1().ConfigMaps("gpu-dra")
	src := &ConfigMapSource{Client: cs, Namespace: "gpu-dra", Name: "gpu-dra-faults", NodeName: "node1", Known: known("gpu-0", "gpu-1")}
	tracker := NewTracker(src)
	var reports []Faults
	tracker.OnChange(func(_ context.Context, _, after Faults) { reports = append(reports, after) })
	done := make(chan error)
	go func() { done <- tracker.Run(ctx) }()
	waitFor(t, func() bool { return received.watches() > 0 }) // the fake sends no events from before its watch

	write := func(data map[string]string) {
		t.Helper()
		cm := NewObject("gpu-dra", "gpu-dra-faults", "node1", "", nil)
		cm.Data = data
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Neither another ConfigMap of the namespace nor the old single one is looked at.
	for _, name := range []string{"other", "gpu-dra-faults"} {
		if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "gpu-dra"}, Data: map[string]string{"node1": good}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	write(map[string]string{"node1": good, "node2": "garbage ["})
	waitFor(t, func() bool { return tracker.Faults()["gpu-1"].Kind == KindXID })

	for _, bad := range []struct{ name, value, logged string }{
		{"unknown device", "gpu-9: {kind: xid, time: \"2026-12-03T10:00:00Z\"}", `device \"gpu-9\": no such device on this node`},
		{"unknown kind", "gpu-0: {kind: melted, time: \"2026-12-03T10:00:00Z\"}", `unknown fault kind \"melted\"`},
		{"garbage", "}}}{{{", `entry \"node1\" is not a map`},
	} {
		t.Run(bad.name, func(t *testing.T) {
			write(map[string]string{"node1": bad.value})
			waitFor(t, func() bool { return strings.Contains(buf.String(), bad.logged) })
			if got := tracker.Faults(); len(got) != 1 || got["gpu-1"].Message != "XID 79" {
				t.Errorf("faults after a bad entry: %v, want the last good ones", got)
			}
			if !strings.Contains(buf.String(), "keeping the faults the node had") {
				t.Errorf("log does not say the faults are kept:\n%s", buf.String())
			}
		})
	}
	if len(reports) != 1 {
		t.Errorf("%d changes reported, want 1 (bad entries and other keys change nothing): %v", len(reports), reports)
	}

	write(map[string]string{"node1": "gpu-0: {kind: fallen-off, time: \"2026-12-03T11:00:00Z\"}"})
	waitFor(t, func() bool { f := tracker.Faults(); return len(f) == 1 && f["gpu-0"].Kind == KindFallenOff })
	write(map[string]string{"node2": good})
	waitFor(t, func() bool { return len(tracker.Faults()) == 0 })
	write(map[string]string{"node1": good})
	waitFor(t, func() bool { return len(tracker.Faults()) == 1 })
	if err := cms.Delete(ctx, ObjectName("gpu-dra-faults", "node1"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(tracker.Faults()) == 0 })

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v after cancel, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("Run did not return after cancel")
	}
}

func TestConfigMapSourceNeedsSettings(t *testing.T) {
	err := (&ConfigMapSource{}).Run(t.Context(), func(Faults) {})
	if err == nil || !strings.Contains(err.Error(), "namespace, name and node name") {
		t.Errorf("error %v, want the missing settings named", err)
	}
}

func TestTrackerSubscribe(t *testing.T) {
	tr := NewTracker(nil)
	ch, cancel := tr.Subscribe()
	defer cancel()
	f := Faults{"gpu-1": {Kind: KindXID, Time: metav1.Now()}}
	tr.set(t.Context(), f)
	tr.set(t.Context(), f) // no change: no second signal
	select {
	case <-ch:
	default:
		t.Fatal("no signal after a change")
	}
	select {
	case <-ch:
		t.Fatal("a signal without a change")
	default:
	}
	f["gpu-2"] = Fault{}
	if len(tr.Faults()) != 1 {
		t.Error("the tracker kept the caller's map")
	}
}

func TestTaintPolicy(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 12, 3, 10, 0, 0, 123, time.UTC))
	p := TaintPolicy{DriverName: "gpu.example.com", NoExecuteKinds: []Kind{KindFallenOff}}
	for kind, effect := range map[Kind]string{KindXID: "NoSchedule", KindFallenOff: "NoExecute"} {
		taint := p.Taint(Fault{Kind: kind, Time: at})
		if taint.Key != "gpu.example.com/unhealthy" || taint.Value != string(kind) || string(taint.Effect) != effect {
			t.Errorf("%s: taint %+v, want gpu.example.com/unhealthy=%s:%s", kind, taint, kind, effect)
		}
		if taint.TimeAdded == nil || !taint.TimeAdded.Equal(&metav1.Time{Time: at.Truncate(time.Second)}) {
			t.Errorf("%s: timeAdded %v, want the fault's time to the second", kind, taint.TimeAdded)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// newLogger logs to t and keeps what was logged, readable while others log.
func newLogger(t *testing.T) (logr.Logger, interface{ String() string }) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	return logger, logger.GetSink().(ktesting.Underlier).GetBuffer()
}
