package metrics

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpu-dra/gpu-dra/driver/podresources"
)

type fakeConsumers struct {
	consumers []podresources.Consumer
	err       error
	calls     int
}

func (f *fakeConsumers) Consumers(context.Context) ([]podresources.Consumer, error) {
	f.calls++
	return f.consumers, f.err
}

var testDevices = []DeviceInfo{
	{Device: "gpu-0", UUID: "GPU-aaa", Model: "A100"},
	{Device: "gpu-1", UUID: "GPU-bbb", Model: "A100"},
	{Device: "gpu-2-part-1", UUID: "GPU-ccc", Model: "H100", Partition: "1"},
}

// TestWorkloads: the exposition of device info and allocations, joined with the kubelet's
// consumers, against testdata/<case>.txt.
func TestWorkloads(t *testing.T) {
	prepared := []PreparedDevice{
		{Namespace: "team-a", Claim: "train-gpu", Request: "gpu", Device: "gpu-0"},
		{Namespace: "team-b", Claim: "infer", Request: "gpu", Device: "gpu-1", ShareID: "s1"},
		{Namespace: "team-b", Claim: "infer2", Request: "gpu", Device: "gpu-1", ShareID: "s2"},
		{Namespace: "team-c", Claim: "part", Request: "slice", Device: "gpu-2-part-1"},
	}
	consumers := []podresources.Consumer{
		{Namespace: "team-a", Pod: "train", Container: "main", ClaimNamespace: "team-a", ClaimName: "train-gpu", Device: "gpu-0"},
		{Namespace: "team-a", Pod: "train", Container: "sidecar", ClaimNamespace: "team-a", ClaimName: "train-gpu", Device: "gpu-0"},
		// Listed twice (two requests of one container on the same device): one series.
		{Namespace: "team-a", Pod: "train", Container: "sidecar", ClaimNamespace: "team-a", ClaimName: "train-gpu", Device: "gpu-0"},
		{Namespace: "team-b", Pod: "web-1", Container: "srv", ClaimNamespace: "team-b", ClaimName: "infer", Device: "gpu-1", ShareID: "s1"},
		{Namespace: "team-b", Pod: "web-2", Container: "srv", ClaimNamespace: "team-b", ClaimName: "infer2", Device: "gpu-1", ShareID: "s2"},
		// Another driver's device of the same claim name elsewhere is not ours (no match by device).
		{Namespace: "team-c", Pod: "p", Container: "c", ClaimNamespace: "team-c", ClaimName: "part", Device: "other-device"},
	}
	for _, tc := range []struct {
		name      string
		consumers *fakeConsumers
		prepared  []PreparedDevice
		max       int
	}{
		{name: "joined", consumers: &fakeConsumers{consumers: consumers}, prepared: prepared},
		{name: "kubelet-unavailable", consumers: &fakeConsumers{err: errors.New("connection refused")}, prepared: prepared},
		{name: "unprepared", consumers: &fakeConsumers{consumers: consumers}, prepared: prepared[1:2]},
		{name: "capped", consumers: &fakeConsumers{consumers: consumers}, prepared: prepared, max: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []Option{WithConsumers(tc.consumers)}
			if tc.max > 0 {
				opts = append(opts, WithMaxAllocationSeries(tc.max))
			}
			m := New(opts...)
			m.SetDevices(testDevices)
			m.SetPrepared(len(tc.prepared), tc.prepared)
			want, err := os.Open(filepath.Join("testdata", "workloads-"+tc.name+".txt"))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = want.Close() }()
			if err := testutil.GatherAndCompare(m.Registry, want, "gpu_dra_device_info", "gpu_dra_device_allocation",
				"gpu_dra_plugin_allocation_series_dropped_total"); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestWorkloadsNoPrepared: with nothing prepared the kubelet is not asked at all.
func TestWorkloadsNoPrepared(t *testing.T) {
	f := &fakeConsumers{}
	m := New(WithConsumers(f))
	m.SetDevices(testDevices)
	if _, err := m.Registry.Gather(); err != nil {
		t.Fatal(err)
	}
	if f.calls != 0 {
		t.Errorf("kubelet asked %d times with nothing prepared", f.calls)
	}
}

// sharedNode is the largest node the cardinality budget is stated for: 8 GPUs of 16 shares
// each, every share used by a pod of two containers.
func sharedNode() ([]DeviceInfo, []PreparedDevice, *fakeConsumers) {
	var devs []DeviceInfo
	var prepared []PreparedDevice
	f := &fakeConsumers{}
	for g := range 8 {
		dev := fmt.Sprintf("gpu-%d", g)
		devs = append(devs, DeviceInfo{Device: dev, UUID: fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", g), Model: "LATEST-GPU-MODEL"})
		for s := range 16 {
			ns, claim, share := fmt.Sprintf("namespace-%02d", s), fmt.Sprintf("claim-%d-%02d", g, s), fmt.Sprintf("share-%d-%02d", g, s)
			prepared = append(prepared, PreparedDevice{Namespace: ns, Claim: claim, Request: "gpu", Device: dev, ShareID: share})
			for _, ctr := range []string{"main", "sidecar"} {
				f.consumers = append(f.consumers, podresources.Consumer{Namespace: ns, Pod: "pod-" + claim, Container: ctr,
					ClaimNamespace: ns, ClaimName: claim, Device: dev, ShareID: share})
			}
		}
	}
	return devs, prepared, f
}

// TestSharedNodeSeries: every share's containers are exported on the largest node, under the cap.
func TestSharedNodeSeries(t *testing.T) {
	devs, prepared, f := sharedNode()
	m := New(WithConsumers(f))
	m.SetDevices(devs)
	m.SetPrepared(len(prepared), prepared)
	if n := testutil.CollectAndCount(m.workloads, "gpu_dra_device_allocation"); n != 8*16*2 {
		t.Errorf("allocation series = %d, want %d", n, 8*16*2)
	}
	if got := testutil.ToFloat64(m.workloads.dropped); got != 0 {
		t.Errorf("dropped = %v, want 0", got)
	}
}

// BenchmarkScrapeSharedNode: what one scrape of the largest node costs, and (reported as
// retained-B) what the metrics keep between scrapes.
func BenchmarkScrapeSharedNode(b *testing.B) {
	devs, prepared, f := sharedNode()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	m := New(WithConsumers(f))
	m.SetDevices(devs)
	m.SetPrepared(len(prepared), prepared)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.Registry.Gather(); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc)-float64(before.HeapAlloc), "retained-B")
	runtime.KeepAlive(m)
}
