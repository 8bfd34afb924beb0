package plugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/driver/faults"
	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// apiServer is what a fake API server keeps, changed as a control-plane upgrade changes it.
type apiServer struct {
	mu       sync.Mutex
	capacity bool
	counters bool
	layout   CounterLayout
	taints   bool
	binding  bool
	down     bool
	probes   int
}

func (s *apiServer) set(f func(*apiServer)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

// probe answers one probe: why the field is dropped ("" when kept by the feature read under the
// lock), or the error of an API server that is down.
func (s *apiServer) probe(kept func() bool, dropped string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.probes++
	switch {
	case s.down:
		return "", errors.New("connection refused")
	case kept():
		return "", nil
	}
	return dropped, nil
}

func (s *apiServer) gate() *SharingGate {
	return &SharingGate{
		ConsumableCapacity: func(context.Context) (string, error) {
			return s.probe(func() bool { return s.capacity }, "API server drops allowMultipleAllocations (DRAConsumableCapacity off)")
		},
		Partitionable: func(context.Context) (CounterLayout, string, error) {
			var layout CounterLayout
			reason, err := s.probe(func() bool { layout = s.layout; return s.counters }, "API server drops sharedCounters (DRAPartitionableDevices off)")
			return layout, reason, err
		},
		BindingConditions: func(context.Context) (string, error) {
			return s.probe(func() bool { return s.binding }, "API server drops bindingConditions (DRADeviceBindingConditions or DRAResourceClaimDeviceStatus off)")
		},
	}
}

func (s *apiServer) probeTaints(context.Context) (string, error) {
	return s.probe(func() bool { return s.taints }, "API server drops devices[].taints")
}

// TestSharingGateRefresh: a gate that fell back re-probes on Refresh and follows the API server
// through an upgrade (and back), saying each change once.
func TestSharingGateRefresh(t *testing.T) {
	logger, logs := newBufferLogger(t)
	ctx := klog.NewContext(t.Context(), logger)
	srv := &apiServer{}
	g := srv.gate()
	shared := nodegroups.GroupSpec{Count: 2, Sharing: &nodegroups.Sharing{Mode: nodegroups.SharedMemory}}
	parts := nodegroups.GroupSpec{Count: 2, Sharing: &nodegroups.Sharing{Mode: nodegroups.Partitioned, Partitions: 2}}
	mode := func(group string, spec nodegroups.GroupSpec) nodegroups.SharingMode {
		return g.Effective(ctx, group, spec).ModeOf()
	}
	if mode("s", shared) != nodegroups.Exclusive || mode("p", parts) != nodegroups.Exclusive {
		t.Fatal("1.35: a group publishes a mode the API server drops")
	}
	if g.Refresh(ctx) {
		t.Error("Refresh reports a change while the API server still drops both")
	}

	srv.set(func(s *apiServer) { s.capacity, s.counters, s.layout = true, true, CountersInOwnSlices }) // 1.36
	if !g.Refresh(ctx) {
		t.Fatal("Refresh missed the upgrade")
	}
	if g.Refresh(ctx) {
		t.Error("a second Refresh without change reports one")
	}
	if mode("s", shared) != nodegroups.SharedMemory || mode("p", parts) != nodegroups.Partitioned {
		t.Error("after the upgrade the groups still fall back")
	}
	for _, feature := range []string{"DRAConsumableCapacity", "DRAPartitionableDevices"} {
		line := `API server now serves a DRA feature; re-publishing feature="` + feature + `"`
		if n := strings.Count(logs.String(), line); n != 1 {
			t.Errorf("%q logged %d times, want once:\n%s", line, n, logs)
		}
	}

	// A failed probe keeps the answer.
	srv.set(func(s *apiServer) { s.down = true })
	if g.Refresh(ctx) || mode("s", shared) != nodegroups.SharedMemory {
		t.Error("an unreachable API server changed the answer")
	}

	// A downgrade (or a restart with the gate off): the fallback is said again, once per group.
	srv.set(func(s *apiServer) { s.down, s.capacity = false, false })
	if !g.Refresh(ctx) || mode("s", shared) != nodegroups.Exclusive || mode("s", shared) != nodegroups.Exclusive {
		t.Error("the gate did not follow the API server back")
	}
	if n := strings.Count(logs.String(), `want="shared-memory"`); n != 2 {
		t.Errorf("fallback of group s logged %d times, want 2 (before the upgrade and after the downgrade):\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), `API server no longer serves a DRA feature; re-publishing feature="DRAConsumableCapacity"`) {
		t.Errorf("the downgrade was not logged:\n%s", logs)
	}
}

// TestSharingGateRefreshAttachable: an attachable group publishes exclusive GPUs until the API
// server keeps binding conditions (a control-plane upgrade to 1.36), then attachable ones, without a
// restart, and says so once.
func TestSharingGateRefreshAttachable(t *testing.T) {
	logger, logs := newBufferLogger(t)
	ctx := klog.NewContext(t.Context(), logger)
	srv := &apiServer{}
	g := srv.gate()
	attachable := nodegroups.GroupSpec{Count: 2, Sharing: &nodegroups.Sharing{Mode: nodegroups.Attachable}}
	if got := g.Effective(ctx, "a", attachable).ModeOf(); got != nodegroups.Exclusive {
		t.Fatalf("1.35: mode %s, want exclusive", got)
	}
	srv.set(func(s *apiServer) { s.binding = true })
	if !g.Refresh(ctx) {
		t.Fatal("Refresh missed the upgrade")
	}
	if got := g.Effective(ctx, "a", attachable).ModeOf(); got != nodegroups.Attachable {
		t.Errorf("after the upgrade: mode %s, want attachable", got)
	}
	line := `API server now serves a DRA feature; re-publishing feature="DRADeviceBindingConditions" mode="attachable"`
	if n := strings.Count(logs.String(), line); n != 1 {
		t.Errorf("%q logged %d times, want once:\n%s", line, n, logs)
	}
}

// TestSharingGateRefreshLayout: 1.34 with DRAPartitionableDevices wants counter sets beside their
// devices, 1.35+ in slices of their own; an upgrade between them re-publishes in the new layout.
func TestSharingGateRefreshLayout(t *testing.T) {
	logger, logs := newBufferLogger(t)
	ctx := klog.NewContext(t.Context(), logger)
	srv := &apiServer{counters: true, layout: CountersWithDevices}
	g := srv.gate()
	parts := nodegroups.GroupSpec{Count: 2, Sharing: &nodegroups.Sharing{Mode: nodegroups.Partitioned, Partitions: 2}}
	g.Effective(ctx, "p", parts)
	if g.Layout() != CountersWithDevices {
		t.Fatalf("layout %s on 1.34", g.Layout())
	}
	srv.set(func(s *apiServer) { s.layout = CountersInOwnSlices })
	if !g.Refresh(ctx) || g.Layout() != CountersInOwnSlices {
		t.Errorf("Refresh missed the layout change: layout %s", g.Layout())
	}
	if g.Refresh(ctx) {
		t.Error("a second Refresh without change reports one")
	}
	if n := strings.Count(logs.String(), "API server keeps partitionable devices"); n != 2 {
		t.Errorf("layout logged %d times, want at the first probe and at the change:\n%s", n, logs)
	}
}

// TestTaintingPublisherRefresh: device taints the API server dropped at start are published once
// it keeps them, without another publish from the caller, and said once.
func TestTaintingPublisherRefresh(t *testing.T) {
	logger, logs := newBufferLogger(t)
	ctx := klog.NewContext(t.Context(), logger)
	srv := &apiServer{}
	fp := &fakePublisher{}
	p := &TaintingPublisher{Publisher: fp, Policy: faults.TaintPolicy{DriverName: testDriver}, Probe: srv.probeTaints}
	resources, err := Resources(ctx, testNode, simulated.New(testNode, nodegroups.GroupSpec{}), CountersInOwnSlices)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.PublishResources(ctx, resources); err != nil {
		t.Fatal(err)
	}
	if err := p.SetFaults(ctx, faults.Faults{"gpu-1": xid("")}); err != nil {
		t.Fatal(err)
	}
	if err := p.Refresh(ctx); err != nil || len(fp.published) != 2 || len(taintsOf(fp.published[1])) != 0 {
		t.Fatalf("Refresh while dropped: %v, %d publishes; want no new publish, no taints", err, len(fp.published))
	}
	srv.set(func(s *apiServer) { s.down = true })
	if err := p.Refresh(ctx); err == nil || p.TaintsServed() {
		t.Errorf("Refresh with the API server down: %v, served %v; want the error, not served", err, p.TaintsServed())
	}
	srv.set(func(s *apiServer) { s.down, s.taints = false, true })
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if len(fp.published) != 3 || !mapsEqual(taintsOf(fp.published[2]), map[string]string{"gpu-1": "gpu.example.com/unhealthy=xid:NoSchedule"}) {
		t.Fatalf("after the upgrade: %d publishes, last taints %v; want the fault's taint re-published", len(fp.published), taintsOf(fp.published[len(fp.published)-1]))
	}
	probes := srv.probes
	if err := p.Refresh(ctx); err != nil || srv.probes != probes || len(fp.published) != 3 {
		t.Errorf("Refresh once served: %v, %d more probes, %d publishes; want nothing asked or published", err, srv.probes-probes, len(fp.published))
	}
	if n := strings.Count(logs.String(), `API server now serves a DRA feature; device taints are published from now on feature="DRADeviceTaints"`); n != 1 {
		t.Errorf("the change logged %d times, want once:\n%s", n, logs)
	}
}

// syncPublisher records publishes from the watcher's goroutine.
type syncPublisher struct {
	mu        sync.Mutex
	published []resourceslice.DriverResources
}

func (p *syncPublisher) PublishResources(_ context.Context, r resourceslice.DriverResources) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.published = append(p.published, r)
	return nil
}

func (p *syncPublisher) last() (resourceslice.DriverResources, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.published) == 0 {
		return resourceslice.DriverResources{}, 0
	}
	return p.published[len(p.published)-1], len(p.published)
}

// TestNodeGroupWatcherFollowsTheAPIServer: the running watcher re-publishes a shared-memory group
// as shared once the API server keeps consumable capacity, with no change of labels or config.
func TestNodeGroupWatcherFollowsTheAPIServer(t *testing.T) {
	logger, logs := newBufferLogger(t)
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), logger))
	defer cancel()
	cfg := filepath.Join(t.TempDir(), "node-groups.yaml")
	if err := os.WriteFile(cfg, []byte("nodeGroups:\n- name: shared\n  nodeSelector: {g: shared}\n  count: 2\n  sharing:\n    mode: shared-memory\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, Labels: map[string]string{"g": "shared"}}}
	srv := &apiServer{}
	gate := srv.gate()
	groups, err := nodegroups.LoadConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	group, spec := groups.GroupFor(node.Labels)
	if gate.Effective(ctx, group, spec).ModeOf() != nodegroups.Exclusive {
		t.Fatal("shared before the upgrade")
	}
	pub := &syncPublisher{}
	w := &NodeGroupWatcher{
		NodeName: testNode, ConfigPath: cfg, Interval: 5 * time.Millisecond, ProbeInterval: 20 * time.Millisecond,
		Client: fake.NewClientset(node), Driver: newHarness(t).driver, Publisher: pub, Current: spec, Sharing: gate,
	}
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	time.Sleep(100 * time.Millisecond) // several re-probes of an API server that still drops it
	if _, n := pub.last(); n != 0 {
		t.Fatalf("%d publishes while nothing changed, want none", n)
	}
	srv.set(func(s *apiServer) { s.capacity = true })
	deadline := time.Now().Add(10 * time.Second)
	for {
		last, n := pub.last()
		if n > 0 {
			shared := 0
			for _, pool := range last.Pools {
				for _, s := range pool.Slices {
					for _, d := range s.Devices {
						if ptr.Deref(d.AllowMultipleAllocations, false) {
							shared++
						}
					}
				}
			}
			if shared != 2 {
				t.Fatalf("re-published %d shared GPUs, want 2", shared)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no re-publish within 10s of the API server keeping consumable capacity:\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if _, n := pub.last(); n != 1 {
		t.Errorf("%d publishes, want exactly one for the one change", n)
	}
}
