package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra/driver/faults"
	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

var faultTime = metav1.NewTime(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))

func xid(msg string) faults.Fault {
	return faults.Fault{Kind: faults.KindXID, Time: faultTime, Message: msg}
}

// fakeTracker is a HealthTracker whose faults a test sets.
type fakeTracker struct {
	mu     sync.Mutex
	faults faults.Faults
	ch     chan struct{}
}

func (f *fakeTracker) Faults() faults.Faults {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.faults
}
func (f *fakeTracker) Subscribe() (<-chan struct{}, func()) { return f.ch, func() {} }
func (f *fakeTracker) set(current faults.Faults) {
	f.mu.Lock()
	f.faults = current
	f.mu.Unlock()
	f.ch <- struct{}{}
}

func TestWatchHealthStatus(t *testing.T) {
	h := newHarness(t)
	_, ctx := ktesting.NewTestContext(t)
	if err := h.driver.WatchHealthStatus(ctx, nil); !errors.Is(err, kubeletplugin.ErrHealthNotSupported) {
		t.Fatalf("without a tracker: %v, want ErrHealthNotSupported", err)
	}
	tr := &fakeTracker{faults: faults.Faults{}, ch: make(chan struct{}, 1)}
	h.driver.health = tr
	ctx, cancel := context.WithCancel(ctx)
	reports := make(chan kubeletplugin.DeviceHealthReport)
	done := make(chan error)
	go func() { done <- h.driver.WatchHealthStatus(ctx, reports) }()

	first := <-reports
	if len(first.Devices) != 8 {
		t.Fatalf("first report covers %d devices, want all 8", len(first.Devices))
	}
	for _, d := range first.Devices {
		if d.Health != kubeletplugin.HealthStatusHealthy || d.PoolName != testNode {
			t.Errorf("device %+v, want healthy in pool %s", d, testNode)
		}
	}
	// An attach failure fails attaches only: gpu-5 stays healthy.
	tr.set(faults.Faults{"gpu-3": xid("XID 79"), "gpu-5": {Kind: faults.KindAttachFailure, Time: faultTime}})
	second := <-reports
	for _, d := range second.Devices {
		want := kubeletplugin.HealthStatusHealthy
		if d.DeviceName == "gpu-3" {
			want = kubeletplugin.HealthStatusUnhealthy
			if d.Message != "xid: XID 79" || !d.LastUpdated.Equal(faultTime.Time) {
				t.Errorf("gpu-3: message %q since %v, want \"xid: XID 79\" since the fault's time", d.Message, d.LastUpdated)
			}
		}
		if d.Health != want {
			t.Errorf("%s is %s, want %s", d.DeviceName, d.Health, want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("WatchHealthStatus returned %v after cancel, want nil", err)
	}
}

// recorder keeps Events as lines "type reason namespace/name: note".
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) AnnotatedEventf(regarding runtime.Object, _ map[string]string, eventtype, reason, note string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ref := fmt.Sprintf("%T", regarding)
	if o, ok := regarding.(*corev1.ObjectReference); ok && o.Kind == "Pod" {
		ref = o.Namespace + "/" + o.Name
	}
	r.events = append(r.events, fmt.Sprintf("%s %s %s: %s", eventtype, reason, ref, fmt.Sprintf(note, args...)))
}

func TestNotifyPods(t *testing.T) {
	h := newHarness(t)
	_, ctx := ktesting.NewTestContext(t)
	c1 := claim("uid-1", "c1", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-1")})
	c2 := claim("uid-2", "c2", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-2")})
	c1.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p1", UID: "pod-1"}, {APIGroup: "example.com", Resource: "jobs", Name: "j"}}
	c2.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p2", UID: "pod-2"}}
	prepare(t, h, c1, c2)
	client := fake.NewClientset(c1, c2)

	r := &recorder{}
	h.driver.NotifyPods(ctx, client.ResourceV1(), r, faults.Faults{}, faults.Faults{"gpu-1": xid("XID 79"), "gpu-5": xid("")})
	want := []string{"Warning DeviceUnhealthy ns/p1: gpu.example.com device node-a/gpu-1 of claim c1 is unhealthy: xid: XID 79"}
	if !slices.Equal(r.events, want) {
		t.Errorf("events %q, want %q", r.events, want)
	}

	r = &recorder{}
	h.driver.NotifyPods(ctx, client.ResourceV1(), r, faults.Faults{"gpu-1": xid("XID 79")}, faults.Faults{"gpu-1": xid("XID 79")})
	if len(r.events) != 0 {
		t.Errorf("events %q for an unchanged fault, want none", r.events)
	}

	r = &recorder{}
	h.driver.NotifyPods(ctx, client.ResourceV1(), r, faults.Faults{"gpu-1": xid("XID 79")}, faults.Faults{"gpu-2": xid("XID 48")})
	slices.Sort(r.events)
	want = []string{
		"Normal DeviceRecovered ns/p1: gpu.example.com device node-a/gpu-1 of claim c1 is healthy again",
		"Warning DeviceUnhealthy ns/p2: gpu.example.com device node-a/gpu-2 of claim c2 is unhealthy: xid: XID 48",
	}
	if !slices.Equal(r.events, want) {
		t.Errorf("events %q, want %q", r.events, want)
	}
}

// fakePublisher records what reaches the helper.
type fakePublisher struct {
	published []resourceslice.DriverResources
}

func (f *fakePublisher) PublishResources(_ context.Context, r resourceslice.DriverResources) error {
	f.published = append(f.published, r)
	return nil
}

func taintsOf(r resourceslice.DriverResources) map[string]string {
	out := map[string]string{}
	for _, pool := range r.Pools {
		for _, s := range pool.Slices {
			for _, d := range s.Devices {
				for _, t := range d.Taints {
					out[d.Name] = t.Key + "=" + t.Value + ":" + string(t.Effect)
				}
			}
		}
	}
	return out
}

func TestTaintingPublisher(t *testing.T) {
	for _, tc := range []struct {
		name      string
		probe     func(context.Context) (string, error)
		want      map[string]string
		wantLog   string
		wantProbe int
	}{
		{name: "served", probe: func(context.Context) (string, error) { return "", nil }, wantProbe: 1,
			want: map[string]string{"gpu-1": "gpu.example.com/unhealthy=xid:NoSchedule", "gpu-2": "gpu.example.com/unhealthy=fallen-off:NoExecute"}},
		{name: "dropped", probe: func(context.Context) (string, error) { return "API server drops devices[].taints", nil }, wantProbe: 1,
			want: map[string]string{}, wantLog: "Device taints are not published"},
		{name: "probe fails", probe: func(context.Context) (string, error) { return "", errors.New("connection refused") }, wantProbe: 3,
			want: map[string]string{}, wantLog: "Cannot tell whether the API server keeps device taints"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger, buf := newBufferLogger(t)
			ctx := klog.NewContext(t.Context(), logger)
			fp := &fakePublisher{}
			probes := 0
			p := &TaintingPublisher{Publisher: fp, Policy: faults.TaintPolicy{DriverName: testDriver, NoExecuteKinds: []faults.Kind{faults.KindFallenOff}},
				Probe: func(ctx context.Context) (string, error) { probes++; return tc.probe(ctx) }}
			injected := faults.Faults{"gpu-1": xid(""), "gpu-2": {Kind: faults.KindFallenOff, Time: faultTime}}
			if err := p.SetFaults(ctx, injected); err != nil || len(fp.published) != 0 {
				t.Fatalf("faults before the first publish: %v, %d publishes; want none", err, len(fp.published))
			}
			resources, err := Resources(ctx, testNode, simulated.New(testNode, nodegroups.GroupSpec{}), CountersInOwnSlices)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.PublishResources(ctx, resources); err != nil {
				t.Fatal(err)
			}
			if got := taintsOf(fp.published[0]); !mapsEqual(got, tc.want) {
				t.Errorf("taints %v, want %v", got, tc.want)
			}
			if got := taintsOf(resources); len(got) != 0 {
				t.Errorf("the caller's resources were changed: %v", got)
			}
			// Clearing re-publishes without taints; another fault re-publishes with it.
			if err := p.SetFaults(ctx, faults.Faults{}); err != nil {
				t.Fatal(err)
			}
			if got := taintsOf(fp.published[1]); len(got) != 0 {
				t.Errorf("taints after clearing: %v", got)
			}
			if err := p.SetFaults(ctx, injected); err != nil {
				t.Fatal(err)
			}
			if len(fp.published) != 3 || probes != tc.wantProbe {
				t.Errorf("%d publishes with %d probes, want 3 with %d", len(fp.published), probes, tc.wantProbe)
			}
			if tc.wantLog != "" && strings.Count(buf.String(), tc.wantLog) != tc.wantProbe {
				t.Errorf("log has %q %d times, want %d:\n%s", tc.wantLog, strings.Count(buf.String(), tc.wantLog), tc.wantProbe, buf.String())
			}
			if p.TaintsServed() != (tc.name == "served") {
				t.Errorf("TaintsServed %v", p.TaintsServed())
			}
		})
	}
}

// newBufferLogger logs to t and keeps what was logged.
func newBufferLogger(t *testing.T) (logr.Logger, interface{ String() string }) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	return logger, logger.GetSink().(ktesting.Underlier).GetBuffer()
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
