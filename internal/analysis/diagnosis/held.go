package diagnosis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/lru"

	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
)

// heldCacheSize bounds the HeldNow answers remembered per state of the claims.
const heldCacheSize = 256

// heldState is the fleet of one snapshot and one generation of claims, with the answers found
// against it.
type heldState struct {
	snapshot *feasibility.Snapshot
	claims   uint64
	fleet    *deviceusage.Fleet
	answers  *lru.Cache
}

// ClaimLister reads the cluster's ResourceClaims, of which only the metadata and
// status.allocation (and reservedFor, for the names of the pods holding devices) matter here.
type ClaimLister interface {
	Claims() ([]*resourceapi.ResourceClaim, error)
}

// Held judges claims against what the current allocations leave free: the diagnosis, run within
// the view's time budget on the fleet of the view's published state and the listed claims, and
// cached per change of either. It is safe for concurrent use.
type Held struct {
	view   *feasibility.View
	claims ClaimLister

	// generation moves on with every change of what claims lists; state is the fleet of one
	// snapshot and one generation of claims.
	generation atomic.Uint64
	mu         sync.Mutex
	state      *heldState
}

// NewHeld judges against the allocations of the claims claims lists; call Invalidate when that
// changes.
func NewHeld(view *feasibility.View, claims ClaimLister) *Held {
	h := &Held{view: view, claims: claims}
	h.generation.Store(1)
	return h
}

// Invalidate says that what the ClaimLister lists has changed.
func (h *Held) Invalidate() { h.generation.Add(1) }

// HeldNow tells, for a claim spec that the view's Unsatisfiable found the published devices can
// satisfy, whether the current allocations leave it devices: "" when they do (or when that is
// unknown), else which devices stand in its way and who holds them. It is a reason to warn, never
// to deny: a claim may wait for devices.
func (h *Held) HeldNow(ctx context.Context, namespace string, spec *resourceapi.ResourceClaimSpec) (string, error) {
	if len(spec.Devices.Requests) == 0 || feasibility.WellFormed(spec) != nil {
		return "", nil
	}
	s, err := h.view.Snapshot()
	if err != nil {
		return "", err
	}
	st, err := h.stateOf(s)
	if err != nil {
		return "", err
	}
	key := feasibility.QuestionKey(namespace, h.view.Features(ctx, s), spec)
	if key != nil {
		if msg, ok := st.answers.Get(*key); ok {
			return msg.(string), nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, h.view.Timeout())
	defer cancel()
	diag, err := newDiagnoser(ctx, h.view, s, namespace, spec, st.fleet).run(ctx)
	if err != nil || ctx.Err() != nil {
		// Interrupted: no answer, and nothing remembered.
		klog.FromContext(ctx).V(2).Info("Current-allocation check ran out of time; no warning", "err", err)
		return "", nil
	}
	msg := ""
	if !diag.Allocatable && waitsForOthers(diag) && !undecided(diag) {
		msg = heldMessage(diag)
	}
	if key != nil {
		st.answers.Add(*key, msg)
	}
	return msg, nil
}

// stateOf returns the fleet of s and the current claims, built once per change of either.
func (h *Held) stateOf(s *feasibility.Snapshot) (*heldState, error) {
	gen := h.generation.Load()
	h.mu.Lock()
	defer h.mu.Unlock()
	if st := h.state; st != nil && st.snapshot == s && st.claims == gen {
		return st, nil
	}
	claims, err := h.claims.Claims()
	if err != nil {
		return nil, fmt.Errorf("list claims: %w", err)
	}
	// The held check reads of the fleet each device's use, capacity, counters and taints, never
	// its attributes (the allocator runs on the slices as published): the slices as kept serve,
	// without building an attribute map for every device of the cluster. Only the busy pools'
	// devices are kept: a free one is no obstacle.
	kept := make([]*resourceapi.ResourceSlice, len(s.Slices()))
	for i, sl := range s.Slices() {
		kept[i] = &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: sl.Name}, Spec: sl.Spec}
	}
	fl := deviceusage.Build(deviceusage.Input{Slices: kept, Claims: claims, BusyPoolsOnly: true})
	st := &heldState{snapshot: s, claims: gen, fleet: fl, answers: lru.New(heldCacheSize)}
	h.state = st
	return st, nil
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

// heldMessage is what keeps each request from its devices now, with who holds them.
func heldMessage(diag *Diagnosis) string {
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
