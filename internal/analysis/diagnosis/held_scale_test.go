package diagnosis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility/feasibilitytest"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

const (
	bigNodes      = 5000
	gpusPerNode   = 8
	bigHeldClaims = 40000
	// hangGuard only tells a blocked call from a slow one: far beyond any deadline involved.
	hangGuard = 2 * time.Minute
)

// bigFleet is bigNodes nodes of gpusPerNode GPUs with a claim holding each of the first
// bigHeldClaims GPUs: every GPU when the two are equal.
func bigFleet(tb testing.TB) (*inventory.Objects, *liveClaims) {
	tb.Helper()
	st := &inventory.Objects{Classes: feasibilitytest.Classes()}
	claims := &liveClaims{byName: map[string]*resourceapi.ResourceClaim{}}
	for n := range bigNodes {
		node := fmt.Sprintf("node-%04d", n)
		st.Nodes = append(st.Nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
		st.Slices = append(st.Slices, feasibilitytest.GPUSlice(node, gpusPerNode, feasibilitytest.Fixed("LATEST-GPU-MODEL"), "80Gi"))
		for g := range gpusPerNode {
			if len(claims.byName) < bigHeldClaims {
				c := heldClaim(node, g)
				claims.put(c)
			}
		}
	}
	return st, claims
}

func heldClaim(node string, gpu int) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", node, gpu), Namespace: "default"},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "gpu", Driver: feasibilitytest.Driver, Pool: node, Device: fmt.Sprintf("gpu-%d", gpu)}}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-" + node, UID: "u"}},
		},
	}
}

// liveClaims is a ClaimLister that changes as an informer's cache does, and whose listing can be
// held (a rebuild that takes forever).
type liveClaims struct {
	mu     sync.Mutex
	byName map[string]*resourceapi.ResourceClaim
	// kept are the claims of byName as the informer keeps them (put).
	kept map[string]*inventory.Claim
	// held, when not nil, blocks Claims until it is closed.
	held chan struct{}
}

func (l *liveClaims) Claims() ([]*inventory.Claim, error) {
	l.mu.Lock()
	held := l.held
	l.mu.Unlock()
	if held != nil {
		<-held
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*inventory.Claim, 0, len(l.byName))
	for _, c := range l.byName {
		out = append(out, l.kept[c.Name])
	}
	return out, nil
}

// put adds or replaces c, kept as the informer keeps it: one object for as long as c is unchanged.
func (l *liveClaims) put(c *resourceapi.ResourceClaim) {
	if l.kept == nil {
		l.kept = map[string]*inventory.Claim{}
	}
	l.byName[c.Name] = c
	l.kept[c.Name] = inventory.KeepClaim(c)
}

func (l *liveClaims) remove(name string) {
	delete(l.byName, name)
	delete(l.kept, name)
}

// hold makes Claims block until the returned release is called (by the test's cleanup at the latest).
func (l *liveClaims) hold(tb testing.TB) (release func()) {
	l.mu.Lock()
	ch := make(chan struct{})
	l.held = ch
	l.mu.Unlock()
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	tb.Cleanup(release)
	return release
}

// churn frees and takes again the GPU of one claim after another every interval, each change
// told to h as the claims informer tells it, until ctx ends.
func (l *liveClaims) churn(ctx context.Context, h *Held, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		node, gpu := fmt.Sprintf("node-%04d", (i/2)%bigNodes), (i/2)%gpusPerNode
		l.mu.Lock()
		if i%2 == 0 {
			l.remove(fmt.Sprintf("%s-%d", node, gpu))
		} else {
			c := heldClaim(node, gpu)
			l.put(c)
		}
		l.mu.Unlock()
		h.Invalidate()
	}
}

func gpuSpec(tb testing.TB, count int) *resourceapi.ResourceClaimSpec {
	tb.Helper()
	spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu", Count: int64(count)}}}}}
	resourceversion.Default(spec)
	return spec
}

func bigHeld(tb testing.TB, timeout time.Duration) (*feasibility.View, *Held, *liveClaims) {
	tb.Helper()
	st, claims := bigFleet(tb)
	view := feasibility.New(st, celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema()), feasibility.WithTimeout(timeout))
	return view, NewHeld(view, claims), claims
}

// heldNowOrHang runs HeldNow and fails the test when it does not return: it waits for something.
func heldNowOrHang(t *testing.T, h *Held, namespace string, spec *resourceapi.ResourceClaimSpec) string {
	t.Helper()
	type answer struct {
		msg string
		err error
	}
	done := make(chan answer, 1)
	go func() {
		msg, err := h.HeldNow(t.Context(), namespace, spec)
		done <- answer{msg, err}
	}()
	select {
	case a := <-done:
		if a.err != nil {
			t.Fatal(a.err)
		}
		return a.msg
	case <-time.After(hangGuard):
		t.Fatal("HeldNow blocked on the rebuild of the current allocations")
		return ""
	}
}

// TestHeldNowNeverWaitsForRebuild: at 5,000 nodes of 8 GPUs, every one held by one of 40,000
// claims that keep changing, reviews answer from the last fleet built while a rebuild is stuck
// (its listing of the claims never returns): concurrent reviews all warn. And after the published
// state changed, with no fleet of it to be had, a review answers within its deadline without the
// warning.
func TestHeldNowNeverWaitsForRebuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a fleet of 40,000 GPUs")
	}
	view, held, claims := bigHeld(t, 5*time.Second)
	spec := gpuSpec(t, 1)
	// The first fleet: built while nothing holds the listing.
	deadline := time.Now().Add(hangGuard)
	for heldNowOrHang(t, held, "default", spec) == "" {
		if time.Now().After(deadline) {
			t.Fatal("no held-now warning with every GPU held")
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go claims.churn(ctx, held, 10*time.Millisecond) // 100 changes a second
	release := claims.hold(t)
	defer release()
	time.Sleep(50 * time.Millisecond) // some changes now wait for a rebuild that cannot list

	var wg sync.WaitGroup
	msgs := make([]string, 8)
	for i := range msgs {
		wg.Go(func() {
			// Another namespace each: a question of its own, not an answer remembered.
			msgs[i] = heldNowOrHang(t, held, fmt.Sprintf("team-%d", i), gpuSpec(t, 1+i%gpusPerNode))
		})
	}
	wg.Wait()
	for i, msg := range msgs {
		if !strings.Contains(msg, "allocated to other claims") {
			t.Errorf("review %d while claims change: %q, want the held-now warning", i, msg)
		}
	}

	view.Invalidate()
	held.Invalidate()
	if _, err := view.Snapshot(); err != nil { // as the review's feasibility check does first
		t.Fatal(err)
	}
	if msg := heldNowOrHang(t, held, "default", gpuSpec(t, 2)); msg != "" {
		t.Errorf("no fleet of the new published state, yet a warning: %q", msg)
	}
}

// BenchmarkHeldNowClaimsChanging: one review's held-now check at 5,000 nodes of 8 GPUs, 40,000
// claims holding them, with a claim changing every 10 ms: the same question every review (claims
// made from one template), and a question of its own each (another namespace). The allocations
// counted include the rebuilds', wherever they run.
func BenchmarkHeldNowClaimsChanging(b *testing.B) {
	_, held, claims := bigHeld(b, time.Minute)
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()
	spec := gpuSpec(b, 1)
	if _, err := held.HeldNow(ctx, "default", spec); err != nil {
		b.Fatal(err)
	}
	go claims.churn(ctx, held, 10*time.Millisecond)
	for _, bc := range []struct {
		name      string
		namespace func(i int) string
	}{
		{"same-question", func(int) string { return "default" }},
		{"question-each-review", func(i int) string { return fmt.Sprintf("ns-%d", i) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := held.HeldNow(ctx, bc.namespace(i), spec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHeldRebuild: one background rebuild of the fleet at 5,000 nodes of 8 GPUs and 40,000
// claims (what a review paid for whenever the claims had changed, before rebuilds left reviews).
func BenchmarkHeldRebuild(b *testing.B) {
	_, held, _ := bigHeld(b, time.Minute)
	if _, err := held.view.Snapshot(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := held.build(); err != nil {
			b.Fatal(err)
		}
	}
}

// churnedClaims are the claims replaced between two rebuilds while claims change at 100/s: a
// second and a quarter apart (rebuildShare).
const churnedClaims = 125

// builtHeld is bigHeld with its first state built and published, as a rebuild finds it.
func builtHeld(tb testing.TB) (*Held, *liveClaims, *heldState) {
	tb.Helper()
	_, h, claims := bigHeld(tb, time.Minute)
	st, err := h.build()
	if err != nil {
		tb.Fatal(err)
	}
	h.state.Store(st)
	return h, claims, st
}

// replace replaces n claims from the from-th on (freed and allocated again: new objects, the same
// devices), as the informer tells them.
func (l *liveClaims) replace(from, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range n {
		i := (from + k) % bigHeldClaims
		l.put(heldClaim(fmt.Sprintf("node-%04d", i/gpusPerNode), i%gpusPerNode))
	}
}

// BenchmarkHeldRebuildChurned: a rebuild after churnedClaims claims were replaced. Most devices
// are the last fleet's (Input.Previous).
func BenchmarkHeldRebuildChurned(b *testing.B) {
	held, claims, _ := builtHeld(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		claims.replace(i*churnedClaims, churnedClaims)
		b.StartTimer()
		st, err := held.build()
		if err != nil {
			b.Fatal(err)
		}
		held.state.Store(st)
	}
}
