package diagnosis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
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
)

// countedClaims counts the listings of a liveClaims: one per rebuild.
type countedClaims struct {
	*liveClaims
	lists atomic.Int64
}

func (c *countedClaims) Claims() ([]*inventory.Claim, error) {
	c.lists.Add(1)
	return c.liveClaims.Claims()
}

// TestHeldRebuildsCoalesced: a burst of claim changes, each followed by a review, is one rebuild
// at most, not one per change; the reviews meanwhile answer from the last fleet built; once the
// next rebuild may start, the answer follows the claims.
func TestHeldRebuildsCoalesced(t *testing.T) {
	st := &inventory.Objects{Classes: feasibilitytest.Classes(), Nodes: []*v1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "node-0000"}}},
		Slices: []*resourceapi.ResourceSlice{feasibilitytest.GPUSlice("node-0000", 2, feasibilitytest.Fixed("LATEST-GPU-MODEL"), "80Gi")}}
	claims := &countedClaims{liveClaims: &liveClaims{byName: map[string]*resourceapi.ResourceClaim{}}}
	for g := range 2 {
		c := heldClaim("node-0000", g)
		claims.put(c)
	}
	view := feasibility.New(st, celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema()), feasibility.WithTimeout(time.Minute))
	const interval = 5 * time.Second
	held := NewHeld(view, claims, WithRebuildInterval(interval))
	spec := gpuSpec(t, 1)
	if msg := heldNowOrHang(t, held, "default", spec); msg == "" {
		t.Fatal("both GPUs held, no warning")
	}
	start := time.Now()
	const changes = 200
	for i := range changes {
		claims.mu.Lock()
		if i%2 == 0 {
			claims.remove("node-0000-0")
		} else {
			c := heldClaim("node-0000", 0)
			claims.put(c)
		}
		claims.mu.Unlock()
		held.Invalidate()
		if msg := heldNowOrHang(t, held, "default", spec); msg == "" && time.Since(start) < interval {
			t.Fatalf("change %d: no warning before the next rebuild could start", i)
		}
	}
	if n := claims.lists.Load(); time.Since(start) < interval && n != 1 {
		t.Errorf("%d listings of the claims for %d changes within the rebuild interval, want the first build's alone", n, changes)
	}
	claims.mu.Lock()
	claims.remove("node-0000-0")
	claims.mu.Unlock()
	held.Invalidate()
	deadline := time.Now().Add(time.Minute)
	for heldNowOrHang(t, held, "default", spec) != "" {
		if time.Now().After(deadline) {
			t.Fatal("a GPU freed a minute ago, still warned about")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestHeldSettle: Settle returns at once when no rebuild is on its way; otherwise once the
// rebuild running and the one a change during it asked for have ended, so that the fleet of
// what the claims were at the call is built; a rebuild that does not end leaves it to its context.
func TestHeldSettle(t *testing.T) {
	st := &inventory.Objects{Classes: feasibilitytest.Classes(), Nodes: []*v1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "node-0000"}}},
		Slices: []*resourceapi.ResourceSlice{feasibilitytest.GPUSlice("node-0000", 2, feasibilitytest.Fixed("LATEST-GPU-MODEL"), "80Gi")}}
	claims := &countedClaims{liveClaims: &liveClaims{byName: map[string]*resourceapi.ResourceClaim{}}}
	view := feasibility.New(st, celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema()), feasibility.WithTimeout(time.Minute))
	held := NewHeld(view, claims, WithRebuildInterval(10*time.Millisecond))
	held.Settle(context.Background())
	if n := claims.lists.Load(); n != 0 || held.state.Load() != nil {
		t.Fatalf("nothing changed: %d listings, fleet %v", n, held.state.Load())
	}

	listing := make(chan struct{})
	claims.mu.Lock()
	claims.held = listing
	claims.mu.Unlock()
	held.Invalidate()
	for claims.lists.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	// A change while the first rebuild lists the claims: the one after it reads it.
	claims.mu.Lock()
	c := heldClaim("node-0000", 0)
	claims.put(c)
	claims.held = nil
	claims.mu.Unlock()
	held.Invalidate()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	held.Settle(ctx)
	cancel()
	if ctx.Err() == nil {
		t.Fatal("Settle returned while a rebuild was still listing the claims")
	}
	settled := make(chan struct{})
	go func() {
		held.Settle(context.Background())
		close(settled)
	}()
	close(listing)
	select {
	case <-settled:
	case <-time.After(time.Minute):
		t.Fatal("Settle did not return after the rebuilds ended")
	}
	if n := claims.lists.Load(); n != 2 {
		t.Errorf("Settle returned after %d listings of the claims, want 2 (the rebuild running and the one the change asked for)", n)
	}
	if msg := heldNowOrHang(t, held, "default", gpuSpec(t, 2)); msg == "" {
		t.Error("the fleet built by the time Settle returned does not hold the claim added during the first rebuild")
	}
}

// TestHeldOneSearchPerQuestion: the reviews asking the same question of a new fleet share one
// diagnosis, and all get its warning.
func TestHeldOneSearchPerQuestion(t *testing.T) {
	st := &inventory.Objects{Classes: feasibilitytest.Classes()}
	claims := &liveClaims{byName: map[string]*resourceapi.ResourceClaim{}}
	for n := range 200 {
		node := fmt.Sprintf("node-%04d", n)
		st.Nodes = append(st.Nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
		st.Slices = append(st.Slices, feasibilitytest.GPUSlice(node, gpusPerNode, feasibilitytest.Fixed("LATEST-GPU-MODEL"), "80Gi"))
		for g := range gpusPerNode {
			c := heldClaim(node, g)
			claims.put(c)
		}
	}
	view := feasibility.New(st, celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema()), feasibility.WithTimeout(time.Minute))
	held := NewHeld(view, claims)
	held.Invalidate()
	held.Settle(t.Context())
	const askers = 32
	msgs := make([]string, askers)
	var wg sync.WaitGroup
	for i := range askers {
		wg.Go(func() { msgs[i] = heldNowOrHang(t, held, "default", gpuSpec(t, 1)) })
	}
	wg.Wait()
	for i, msg := range msgs {
		if !strings.Contains(msg, "allocated to other claims") {
			t.Errorf("asker %d: %q, want the held-now warning", i, msg)
		}
	}
	if n := held.state.Load().answers.Searches(); n != 1 {
		t.Errorf("%d diagnoses for %d reviews of one question, want 1", n, askers)
	}
}
