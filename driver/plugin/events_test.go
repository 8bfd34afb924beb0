package plugin

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpu-dra/gpu-dra/driver/faults"
)

// TestNotifyPodsRateLimited flaps the fault of one GPU 50 times, each time with another XID, through
// NotifyPods and the plugin's Event broadcaster (a fake clock, a sink that counts what reaches the
// API server): its pod gets EventBurst DeviceUnhealthy and EventBurst DeviceRecovered Events, and
// one more of each after EventRefill; another GPU of the same pod, and the pod of another GPU,
// still get their own.
func TestNotifyPodsRateLimited(t *testing.T) {
	h := newHarness(t)
	_, ctx := ktesting.NewTestContext(t)
	c1 := claim("uid-1", "c1", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-1")})
	c2 := claim("uid-2", "c2", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-2")})
	c3 := claim("uid-3", "c3", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-3")})
	c1.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p1", UID: "pod-1"}}
	c2.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p2", UID: "pod-2"}}
	c3.Status.ReservedFor = c1.Status.ReservedFor
	prepare(t, h, c1, c2, c3)
	claims := fake.NewClientset(c1, c2, c3).ResourceV1()

	clock := clocktesting.NewFakeClock(time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC))
	broadcaster := NewEventBroadcaster(WithEventClock(clock))
	sink := &countingSink{}
	broadcaster.StartRecordingToSink(sink)
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "gpu-kubelet-plugin", Host: testNode})

	flap := func(times int) {
		for i := range times {
			fault := faults.Faults{"gpu-1": xid(fmt.Sprintf("XID %d", 40+i))}
			h.driver.NotifyPods(ctx, claims, recorder, faults.Faults{}, fault)
			h.driver.NotifyPods(ctx, claims, recorder, fault, faults.Faults{})
		}
	}
	// p2's Events go last: once the sink has them, it has seen every earlier one.
	other := func(before, after faults.Faults, want int) {
		t.Helper()
		h.driver.NotifyPods(ctx, claims, recorder, before, after)
		waitUntil(t, func() bool { return sink.count("p2") == want })
	}

	flap(50)
	h.driver.NotifyPods(ctx, claims, recorder, faults.Faults{}, faults.Faults{"gpu-3": xid("XID 31")})
	other(faults.Faults{}, faults.Faults{"gpu-2": xid("XID 79")}, 1)
	if got := sink.byReason("p1"); got[ReasonDeviceUnhealthy] != EventBurst+1 || got[ReasonDeviceRecovered] != EventBurst {
		t.Errorf("50 flaps of gpu-1 and a fault of gpu-3 wrote %v Events about p1, want %d DeviceUnhealthy (one of gpu-3) and %d DeviceRecovered",
			got, EventBurst+1, EventBurst)
	}
	if !sink.said("p1", "node-a/gpu-3 of claim c3 is unhealthy: xid: XID 31") {
		t.Error("p1 was not told about gpu-3 after gpu-1 flapped")
	}

	clock.Step(EventRefill)
	flap(50)
	other(faults.Faults{"gpu-2": xid("XID 79")}, faults.Faults{}, 2)
	if got := sink.byReason("p1"); got[ReasonDeviceUnhealthy] != EventBurst+2 || got[ReasonDeviceRecovered] != EventBurst+1 {
		t.Errorf("after %s, 50 more flaps wrote %v Events about p1 in all, want one more of each reason", EventRefill, got)
	}
}

// countingSink is the API server's end of the broadcaster: it counts each write (create, or
// patch of a repeated Event) by pod and reason.
type countingSink struct {
	mu       sync.Mutex
	writes   map[string]map[string]int
	messages []string
}

func (s *countingSink) add(e *corev1.Event) (*corev1.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writes == nil {
		s.writes = map[string]map[string]int{}
	}
	pod := e.InvolvedObject.Name
	if s.writes[pod] == nil {
		s.writes[pod] = map[string]int{}
	}
	s.writes[pod][e.Reason]++
	s.messages = append(s.messages, pod+": "+e.Message)
	return e, nil
}

func (s *countingSink) Create(e *corev1.Event) (*corev1.Event, error) { return s.add(e) }
func (s *countingSink) Update(e *corev1.Event) (*corev1.Event, error) { return s.add(e) }
func (s *countingSink) Patch(e *corev1.Event, _ []byte) (*corev1.Event, error) {
	return s.add(e)
}

func (s *countingSink) byReason(pod string) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for r, n := range s.writes[pod] {
		out[r] = n
	}
	return out
}

func (s *countingSink) said(pod, message string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.ContainsFunc(s.messages, func(m string) bool { return strings.HasPrefix(m, pod+": ") && strings.HasSuffix(m, message) })
}

func (s *countingSink) count(pod string) int {
	n := 0
	for _, c := range s.byReason(pod) {
		n += c
	}
	return n
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
