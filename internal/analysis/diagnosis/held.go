package diagnosis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
)

// Held judges claims against what the current allocations leave free: the diagnosis, run within
// the view's time budget on a fleet of the view's published state and the listed claims, and
// cached per such fleet. The fleet is rebuilt in the background (see held_state.go), never by a
// review: a review reads the last one built and waits for a newer one only within its deadline.
// It is safe for concurrent use.
type Held struct {
	view   *feasibility.View
	claims ClaimLister
	// interval is the least time between the starts of two rebuilds: the events of a burst of
	// claim changes are coalesced into one. A rebuild that took long makes the next wait longer
	// (rebuildShare).
	interval time.Duration
	// observers are told of each fleet built (WithRebuildObserver).
	observers []func(Rebuilt)

	// state is the last fleet built, read by reviews without a lock.
	state atomic.Pointer[heldState]

	mu sync.Mutex
	// running: a rebuild goroutine is on its way; again: something changed since it started.
	running, again bool
	// notBefore is when the next rebuild may start.
	notBefore time.Time
	// published is closed, and replaced, each time a rebuild ends: reviews waiting for a fleet
	// of their snapshot look again.
	published chan struct{}
	// failed is why the last rebuild built nothing (the claims not listed yet), or nil.
	failed error
}

// ClaimLister reads the cluster's ResourceClaims as a fleet reads them: name, allocation and
// consumers (for the names of the pods holding devices).
type ClaimLister interface {
	Claims() ([]*inventory.Claim, error)
}

// HeldOption configures a Held.
type HeldOption func(*Held)

// WithRebuildInterval sets the least time between the starts of two rebuilds of the fleet
// (default DefaultRebuildInterval): a rebuild reads every claim and device, and with claims
// changing all the time the interval is how stale the held-now warning may be.
func WithRebuildInterval(d time.Duration) HeldOption { return func(h *Held) { h.interval = d } }

// Rebuilt is what one rebuild read and built, for observers. Read-only: the reviews share it.
type Rebuilt struct {
	// Slices are every published slice, as the inventory keeps them.
	Slices []*inventory.Slice
	// Fleet is the busy pools' devices with their use (deviceusage.Input.BusyPoolsOnly): a device
	// of any other pool is free and healthy.
	Fleet *deviceusage.Fleet
	// Claims are the claims listed, as the inventory keeps them.
	Claims []*inventory.Claim
}

// WithRebuildObserver has f called at the end of each rebuild of the fleet, in the background
// goroutine that built it (never by a review): what the whole fleet is doing can be summed there
// once, rather than listed again. Its time counts as the rebuild's (rebuildShare bounds both).
func WithRebuildObserver(f func(Rebuilt)) HeldOption {
	return func(h *Held) { h.observers = append(h.observers, f) }
}

// DefaultRebuildInterval: at 40,000 claims a rebuild takes a quarter of a second of one CPU.
const DefaultRebuildInterval = time.Second

// NewHeld judges against the allocations of the claims claims lists; call Invalidate when that,
// or the view's published state, changes.
func NewHeld(view *feasibility.View, claims ClaimLister, opts ...HeldOption) *Held {
	h := &Held{view: view, claims: claims, interval: DefaultRebuildInterval}
	for _, o := range opts {
		o(h)
	}
	return h
}

// Invalidate says that what the ClaimLister lists, or the view's published state, has changed:
// a rebuild starts in the background, coalesced with any other change of the same burst.
func (h *Held) Invalidate() { h.kick() }

// HeldNow tells, for a claim spec that the view's Unsatisfiable found the published devices can
// satisfy, whether the current allocations leave it devices: "" when they do (or when that is
// unknown), else which devices stand in its way and who holds them. It is a reason to warn, never
// to deny: a claim may wait for devices. It answers within the view's timeout: when no fleet of
// the current published state is built by then, it answers "".
func (h *Held) HeldNow(ctx context.Context, namespace string, spec *resourceapi.ResourceClaimSpec) (string, error) {
	if len(spec.Devices.Requests) == 0 || feasibility.WellFormed(spec) != nil {
		return "", nil
	}
	s, err := h.view.Snapshot()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, h.view.Timeout())
	defer cancel()
	st, err := h.stateOf(ctx, s)
	if err != nil {
		return "", err
	}
	if st == nil {
		klog.FromContext(ctx).V(2).Info("Current allocations not indexed in time; no current-allocation check")
		return "", nil
	}
	// One search a question per fleet for every review asking it meanwhile (package answers).
	key := feasibility.QuestionKey(namespace, h.view.Features(ctx, s), spec)
	msg, ok := st.answers.Find(ctx, key, h.view.Timeout(), func(ctx context.Context) (string, bool) {
		return h.heldMessage(ctx, st, namespace, spec)
	})
	if !ok {
		klog.FromContext(ctx).V(2).Info("Current-allocation check not done within the review's time; no warning")
	}
	return msg, nil
}

// heldMessage diagnoses spec against st's fleet: the held-now warning, or "". ok is false when
// the diagnosis was interrupted: no answer then, and nothing to remember.
func (h *Held) heldMessage(ctx context.Context, st *heldState, namespace string, spec *resourceapi.ResourceClaimSpec) (msg string, ok bool) {
	diag, err := newDiagnoser(ctx, h.view, st.snapshot, namespace, spec, st.fleet, st.devices).run(ctx)
	if err != nil || ctx.Err() != nil {
		klog.FromContext(ctx).V(2).Info("Current-allocation check ran out of time; no warning", "err", err)
		return "", false
	}
	if !diag.Allocatable && waitsForOthers(diag) && !undecided(diag) {
		return heldMessageOf(diag), true
	}
	return "", true
}

// undecided: the allocator could not give an answer (it failed, or had no time for every node).
func undecided(diag *Diagnosis) bool {
	for _, f := range diag.Findings {
		if f.Cause == CauseUnknown {
			return true
		}
	}
	return false
}

// heldMessageOf is what keeps each request from its devices now, with who holds them.
func heldMessageOf(diag *Diagnosis) string {
	var parts []string
	for _, r := range diag.Requests {
		for _, f := range r.Findings {
			if f.Cause != CauseAllocated && f.Cause != CauseCounters && f.Cause != CauseCapacity {
				continue
			}
			p := fmt.Sprintf("request %s: %s", r.Name, f.Message)
			if len(f.Details) > 0 {
				p += " (" + strings.Join(f.Details, "; ") + ")"
			}
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "; ")
}
