package servedfeatures

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// upgradable answers as an API server whose gates a control-plane upgrade turns on, or as one
// that is down.
type upgradable struct {
	served, down atomic.Bool
}

func (u *upgradable) answer(t *resourceapi.ResourceClaimTemplate) (*resourceapi.ResourceClaimTemplate, error) {
	switch {
	case u.down.Load():
		return nil, apierrors.NewServiceUnavailable("the API server restarts")
	case u.served.Load():
		return needsLabel(t)
	}
	return drop(t)
}

// TestRefresh: Refresh follows an upgrade at once, whatever the cache's TTL, says each change
// once, and keeps its answers through an API server restart.
func TestRefresh(t *testing.T) {
	ctx, logs := capture(t)
	srv := &upgradable{}
	plain := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.example.com"}}
	classes := []*resourceapi.DeviceClass{plain}
	clk := clocktesting.NewFakePassiveClock(time.Now()) // never advances: the TTL never runs out
	d := newDetector(&fakeTemplates{answer: srv.answer}, "ns", WithClock(clk),
		WithStoredClasses(func() []*resourceapi.DeviceClass { return classes }))
	d.Warm(ctx)
	d.Refresh(ctx)
	if list, _ := d.PrioritizedList(ctx); list {
		t.Fatal("served before the upgrade")
	}

	srv.served.Store(true)
	named := plain.DeepCopy()
	named.Spec.ExtendedResourceName = ptr.To("gpu.example.com/gpu")
	classes = []*resourceapi.DeviceClass{named}
	d.Refresh(ctx)
	list, err1 := d.PrioritizedList(ctx)
	admin, err2 := d.AdminAccess(ctx)
	capacity, err3 := d.ConsumableCapacity(ctx)
	if !list || admin != AdminAccessNeedsLabel || !capacity || err1 != nil || err2 != nil || err3 != nil {
		t.Errorf("after the upgrade and a Refresh: list %v, admin %v, capacity %v (%v, %v, %v); want all served",
			list, admin, capacity, err1, err2, err3)
	}
	d.Refresh(ctx)
	for _, f := range []Feature{PrioritizedList, AdminAccess, ConsumableCapacity, ExtendedResource} {
		line := `"The API server now serves a DRA feature" feature="` + string(f) + `"`
		if n := strings.Count(logs.String(), line); n != 1 {
			t.Errorf("%s logged %d times, want once:\n%s", line, n, logs)
		}
	}

	srv.down.Store(true)
	d.Refresh(ctx)
	if list, err := d.PrioritizedList(ctx); !list || err != nil {
		t.Errorf("a failed Refresh replaced the answer: %v, %v", list, err)
	}
	if strings.Contains(logs.String(), "no longer serves") {
		t.Errorf("a failed Refresh was logged as a change:\n%s", logs)
	}
}

// TestRun: the periodic Refresh picks an upgrade up without any request and without the cache
// expiring.
func TestRun(t *testing.T) {
	logs := &lockedBuffer{}
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logs)))))
	done := make(chan struct{})
	defer func() { cancel(); <-done }()
	srv := &upgradable{}
	f := &fakeTemplates{answer: srv.answer}
	d := newDetector(f, "ns", WithClock(clocktesting.NewFakePassiveClock(time.Now())))
	if capacity, _ := d.ConsumableCapacity(ctx); capacity {
		t.Fatal("served before the upgrade")
	}
	go func() { defer close(done); d.Run(ctx, 10*time.Millisecond) }()
	srv.served.Store(true)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), `"The API server now serves a DRA feature" feature="DRAConsumableCapacity"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no change noticed within 10s:\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if capacity, _ := d.ConsumableCapacity(ctx); !capacity {
		t.Error("the cached answer was not refreshed")
	}
}

// lockedBuffer is a log written by Run's goroutine and read by the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
