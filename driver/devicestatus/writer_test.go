package devicestatus

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

const testDriver = "gpu.example.com"

var claimGR = schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}

// fakeServer stands in for the API server in the queue's tests: it answers applies from a script
// and keeps what a real server would store. The real server is in apiserver_test.go.
type fakeServer struct {
	mutex   sync.Mutex
	applies []claimRef
	// answers are returned in order; when they run out, the apply succeeds.
	answers []error
	// drop makes successful applies store nothing, as a server with the field's gate off.
	drop   bool
	claims map[string]*resourceapi.ResourceClaim
}

func (f *fakeServer) apply(_ context.Context, c claimRef, want []entry) (stored, error) {
	f.mutex.Lock()
	defer f.mutex.Unlock()
	f.applies = append(f.applies, c)
	if len(f.answers) > 0 {
		err := f.answers[0]
		f.answers = f.answers[1:]
		if err != nil {
			return stored{}, err
		}
	}
	s := stored{allocated: true}
	if !f.drop {
		for _, e := range want {
			s.devices = append(s.devices, v1Status(testDriver, e.pool, e.device, nil, &runtime.RawExtension{Raw: e.data}))
		}
	}
	return s, nil
}

func (f *fakeServer) get(_ context.Context, c claimRef) (*resourceapi.ResourceClaim, error) {
	f.mutex.Lock()
	defer f.mutex.Unlock()
	if claim, ok := f.claims[c.Name]; ok {
		return claim, nil
	}
	return nil, apierrors.NewNotFound(claimGR, c.Name)
}

func (f *fakeServer) count() int {
	f.mutex.Lock()
	defer f.mutex.Unlock()
	return len(f.applies)
}

func newTestWriter(t *testing.T, f *fakeServer, opts ...Option) (*Writer, context.Context, ktesting.Buffer) {
	t.Helper()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx := klog.NewContext(t.Context(), logger)
	opts = append([]Option{WithRetry(4, time.Millisecond, 5*time.Millisecond)}, opts...)
	w := newWriter(testDriver, "v1", f.apply, f.get, opts...)
	w.logger = logger // what Record logs before Start
	return w, ctx, logger.GetSink().(ktesting.Underlier).GetBuffer()
}

// settle waits until the writer has nothing queued.
func settle(t *testing.T, w *Writer) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for w.Pending() > 0 || w.queue.Len() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d claims still pending", w.Pending())
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // a write in flight
}

func testClaim(name string, devices ...string) (*resourceapi.ResourceClaim, []Device) {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	var devs []Device
	for i, d := range devices {
		devs = append(devs, Device{Pool: "node-a", Name: d, Attributes: gpuAttributes(i, "M")})
	}
	return c, devs
}

func TestWriterWritesOnce(t *testing.T) {
	f := &fakeServer{}
	w, ctx, _ := newTestWriter(t, f)
	defer w.Start(ctx)()
	claim, devs := testClaim("c", "gpu-0", "gpu-1")
	w.Record(claim, devs)
	settle(t, w)
	if f.count() != 1 {
		t.Fatalf("%d applies, want 1", f.count())
	}

	// The kubelet prepares the claim again (after its restart): the claim it read shows the data.
	want, _ := entries(devs)
	for _, e := range want {
		claim.Status.Devices = append(claim.Status.Devices, v1Status(testDriver, e.pool, e.device, nil, &runtime.RawExtension{Raw: e.data}))
	}
	w.Record(claim, devs)
	settle(t, w)
	if f.count() != 1 {
		t.Errorf("same data written again: %d applies", f.count())
	}
	// No devices with data: nothing to write.
	bare, _ := testClaim("bare")
	w.Record(bare, []Device{{Pool: "node-a", Name: "gpu-9"}})
	settle(t, w)
	if f.count() != 1 {
		t.Errorf("a claim without data was written: %d applies", f.count())
	}
}

func TestWriterRetries(t *testing.T) {
	unavailable := apierrors.NewServiceUnavailable("etcd leader changed")
	invalid := apierrors.NewInvalid(schema.GroupKind{Group: "resource.k8s.io", Kind: "ResourceClaim"}, "c",
		field.ErrorList{field.Invalid(field.NewPath("status", "devices").Index(0), "gpu-0", "must be an allocated device in the claim")})
	forbidden := apierrors.NewForbidden(claimGR, "c", errors.New(`changing status.devices requires resource="resourceclaims/driver"`))
	tests := []struct {
		name        string
		answers     []error
		wantApplies int
		wantLog     string
	}{
		{name: "transient errors, then success", answers: []error{unavailable, unavailable}, wantApplies: 3},
		{name: "given up after the attempts", answers: []error{unavailable, unavailable, unavailable, unavailable, unavailable}, wantApplies: 4,
			wantLog: "after 4 attempts"},
		{name: "refused: not retried", answers: []error{invalid}, wantApplies: 1, wantLog: "the API server refused the status"},
		{name: "claim deleted meanwhile: not retried", answers: []error{apierrors.NewNotFound(claimGR, "c")}, wantApplies: 1},
		{name: "forbidden: retried, and the message says which permission", answers: []error{forbidden, forbidden, forbidden, forbidden}, wantApplies: 4,
			wantLog: "associated-node:patch on resourceclaims/driver named gpu.example.com"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeServer{answers: tc.answers}
			w, ctx, logs := newTestWriter(t, f)
			defer w.Start(ctx)()
			claim, devs := testClaim("c", "gpu-0")
			w.Record(claim, devs)
			settle(t, w)
			if f.count() != tc.wantApplies {
				t.Errorf("%d applies, want %d", f.count(), tc.wantApplies)
			}
			if tc.wantLog != "" && !strings.Contains(logs.String(), tc.wantLog) {
				t.Errorf("log lacks %q:\n%s", tc.wantLog, logs.String())
			}
		})
	}
}

func TestWriterForgetsUnprepared(t *testing.T) {
	f := &fakeServer{}
	w, ctx, _ := newTestWriter(t, f)
	claim, devs := testClaim("c", "gpu-0")
	w.Record(claim, devs)
	w.Forget(claim.UID)
	defer w.Start(ctx)()
	settle(t, w)
	if f.count() != 0 {
		t.Errorf("status of an unprepared claim written (%d applies)", f.count())
	}

	// Unprepared while a write is being retried: the retry is dropped. The backoff is long enough
	// that the retry cannot land between the failed write and Forget on a loaded machine (with
	// 1 ms it did), short enough that a retry Forget failed to drop lands before settle returns.
	f = &fakeServer{answers: []error{apierrors.NewServiceUnavailable("x")}}
	w, ctx, _ = newTestWriter(t, f, WithRetry(4, 300*time.Millisecond, time.Second))
	defer w.Start(ctx)()
	w.Record(claim, devs)
	deadline := time.Now().Add(5 * time.Second)
	for f.count() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	w.Forget(claim.UID)
	settle(t, w)
	if f.count() != 1 {
		t.Errorf("%d applies, want the failed one only", f.count())
	}
}

func TestWriterBounded(t *testing.T) {
	f := &fakeServer{}
	w, ctx, logs := newTestWriter(t, f, WithMaxPending(2))
	for _, name := range []string{"a", "b", "c"} {
		claim, devs := testClaim(name, "gpu-0")
		w.Record(claim, devs)
	}
	// The same claim again replaces its queued entry instead of taking another place.
	claim, devs := testClaim("a", "gpu-0", "gpu-1")
	w.Record(claim, devs)
	if w.Pending() != 2 {
		t.Errorf("%d claims pending, want the bound of 2", w.Pending())
	}
	if !strings.Contains(logs.String(), "2 claims are waiting for their status already") {
		t.Errorf("dropping a claim was not logged:\n%s", logs.String())
	}
	defer w.Start(ctx)()
	settle(t, w)
	if f.count() != 2 {
		t.Errorf("%d applies, want 2 (a once, with its latest devices, and b)", f.count())
	}
}

// A server that drops status.devices: the writer says so once and writes nothing more.
func TestWriterStopsWhereTheFieldIsDropped(t *testing.T) {
	f := &fakeServer{drop: true}
	w, ctx, logs := newTestWriter(t, f)
	defer w.Start(ctx)()
	for _, name := range []string{"a", "b"} {
		claim, devs := testClaim(name, "gpu-0")
		w.Record(claim, devs)
		settle(t, w)
	}
	w.Resync("ns", "c", "uid-c", []Device{{Pool: "node-a", Name: "gpu-0", Attributes: gpuAttributes(0, "M")}})
	settle(t, w)
	if f.count() != 1 {
		t.Errorf("%d applies, want 1", f.count())
	}
	const line = "The API server drops ResourceClaim status.devices"
	if n := strings.Count(logs.String(), line); n != 1 {
		t.Errorf("%q logged %d times, want once:\n%s", line, n, logs.String())
	}
	if !strings.Contains(logs.String(), "resource.k8s.io/v1") {
		t.Errorf("the line does not name the API version:\n%s", logs.String())
	}
}

// After a restart the claim is read first; only what is missing is written.
func TestWriterResync(t *testing.T) {
	done, devs := testClaim("done", "gpu-0")
	want, _ := entries(devs)
	done.Status.Devices = []resourceapi.AllocatedDeviceStatus{v1Status(testDriver, "node-a", "gpu-0", nil, &runtime.RawExtension{Raw: want[0].data})}
	missing, _ := testClaim("missing", "gpu-0")
	replaced, _ := testClaim("replaced", "gpu-0")
	replaced.UID = "new-uid"
	deallocated, _ := testClaim("deallocated", "gpu-0")
	deallocated.Status.Allocation = nil
	f := &fakeServer{claims: map[string]*resourceapi.ResourceClaim{
		"done": done, "missing": missing, "replaced": replaced, "deallocated": deallocated,
	}}
	w, ctx, _ := newTestWriter(t, f)
	defer w.Start(ctx)()
	for _, name := range []string{"done", "missing", "replaced", "deallocated", "deleted"} {
		w.Resync("ns", name, types.UID("uid-"+name), devs)
	}
	settle(t, w)
	if len(f.applies) != 1 || f.applies[0].Name != "missing" {
		t.Errorf("applies %v, want only the claim without data", f.applies)
	}
}
