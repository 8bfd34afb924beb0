package diagnosis

import (
	"context"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra/internal/analysis/answers"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
)

// heldCacheSize bounds the HeldNow answers remembered per fleet.
const heldCacheSize = 256

// heldState is the fleet of one snapshot and the claims listed then, with its index by the
// snapshot's devices and the answers found against it. Immutable once published, but for the
// answers (an answers.Cache is safe for concurrent use).
type heldState struct {
	snapshot *feasibility.Snapshot
	fleet    *deviceusage.Fleet
	devices  fleetIndex
	answers  *answers.Cache
	// slices are what the fleet was built on, by the index of snapshot.Slices(): the slices as the
	// fleet reads them, nil for those it does not hold (onlyIn).
	slices []*resourceapi.ResourceSlice
}

// stateOf returns the last fleet built if it is of s, however many claims changed since: the
// next one is on its way (Invalidate started it) and the warning is advisory. Otherwise it has a
// fleet of s built and waits for it until ctx ends, and then returns nil.
func (h *Held) stateOf(ctx context.Context, s *feasibility.Snapshot) (*heldState, error) {
	for {
		if st := h.state.Load(); st != nil && st.snapshot == s {
			return st, nil
		}
		published := h.kick()
		select {
		case <-published:
		case <-ctx.Done():
			return nil, nil
		}
		h.mu.Lock()
		failed := h.failed
		h.mu.Unlock()
		if st := h.state.Load(); (st == nil || st.snapshot != s) && failed != nil {
			return nil, failed
		}
	}
}

// kick makes sure a rebuild is on its way and returns the channel closed when it ends. A rebuild
// already running is done again after it, once, however many changes came meanwhile.
func (h *Held) kick() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.published == nil {
		h.published = make(chan struct{})
	}
	if h.running {
		h.again = true
	} else {
		h.running = true
		go h.rebuild(time.Until(h.notBefore))
	}
	return h.published
}

// Settle returns once the rebuilds running or due when it is called have ended (the one on its
// way and the one a change since asked for; claims changing all the time start more, which it
// does not wait for), or when ctx ends: called after the initial lists, it returns once the fleet
// of the listed state is built.
func (h *Held) Settle(ctx context.Context) {
	for range 2 {
		h.mu.Lock()
		if !h.running {
			h.mu.Unlock()
			return
		}
		if h.published == nil {
			h.published = make(chan struct{})
		}
		published := h.published
		h.mu.Unlock()
		select {
		case <-published:
		case <-ctx.Done():
			return
		}
	}
}

// rebuildShare: rebuilds one after the other take at most 1/rebuildShare of one CPU, however
// large the fleet and however often claims change.
const rebuildShare = 5

// rebuild builds fleets until nothing changed during the last build, each starting at least the
// interval, and rebuildShare times the last build's duration, after the previous one did: the
// waits coalesce a burst of changes into one build.
func (h *Held) rebuild(delay time.Duration) {
	for {
		if delay > 0 {
			time.Sleep(delay)
		}
		start := time.Now()
		h.mu.Lock()
		h.again = false
		h.mu.Unlock()
		st, err := h.build()
		h.mu.Lock()
		h.notBefore = start.Add(max(h.interval, rebuildShare*time.Since(start)))
		if err == nil {
			h.state.Store(st)
		}
		h.failed = err
		if h.published != nil {
			close(h.published)
			h.published = nil
		}
		if !h.again {
			h.running = false
			h.mu.Unlock()
			return
		}
		delay = time.Until(h.notBefore)
		h.mu.Unlock()
	}
}

// build indexes the current claims' allocations on the view's current published state.
func (h *Held) build() (*heldState, error) {
	s, err := h.view.Snapshot()
	if err != nil {
		return nil, err
	}
	claims, err := h.claims.Claims()
	if err != nil {
		return nil, fmt.Errorf("list claims: %w", err)
	}
	// The held check reads of the fleet each device's use, capacity, counters and taints, never
	// its attributes (the allocator runs on the slices as published): the slices as kept serve,
	// without building an attribute map for every device of the cluster. Only the busy pools'
	// devices are kept: a free one is no obstacle.
	var before []*inventory.Slice
	var beforeKept []*resourceapi.ResourceSlice
	var previous *deviceusage.Fleet
	if last := h.state.Load(); last != nil {
		before, beforeKept, previous = last.snapshot.Slices(), last.slices, last.fleet
	}
	kept := keptSlices(s.Slices(), before, beforeKept)
	uses := make([]*deviceusage.Claim, len(claims))
	for i, c := range claims {
		uses[i] = &c.Claim
	}
	// The last fleet's devices that no claim change touched are this one's too (Previous).
	fl := deviceusage.Build(deviceusage.Input{Slices: kept, Kept: uses, BusyPoolsOnly: true, Previous: previous})
	for _, observe := range h.observers {
		observe(Rebuilt{Slices: s.Slices(), Fleet: fl, Claims: claims})
	}
	return &heldState{snapshot: s, fleet: fl, devices: indexFleet(s, fl), answers: answers.New(heldCacheSize), slices: onlyIn(kept, fl.Slices)}, nil
}

// onlyIn clears the slices of kept that fleet, a subsequence of kept, lacks: the fleet holds its
// busy pools' slices anyway, and holding every other slice for the next build would be 2 MB at
// 5,000 idle nodes. A slice the fleet replaced (with a DeviceTaintRule's taints) is cleared too.
func onlyIn(kept, fleet []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	j := 0
	for i, sl := range kept {
		if j < len(fleet) && fleet[j] == sl {
			j++
			continue
		}
		kept[i] = nil
	}
	return kept
}

// keptSlices are the published slices as the fleet reads them: the spec under the name. Those of
// them the last fleet was built on too (before, kept as beforeKept) are taken from it: a slice
// changes far less often than claims do, and the new state and the last one, which stays published
// while the new one is built, share them rather than each holding a copy of every slice.
func keptSlices(published, before []*inventory.Slice, beforeKept []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	var at map[*inventory.Slice]int
	kept := make([]*resourceapi.ResourceSlice, len(published))
	for i, sl := range published {
		// A change moves few slices, if any: where they were is the place to look first.
		j, ok := i, i < len(before) && before[i] == sl
		if !ok && len(before) > 0 {
			if at == nil {
				at = make(map[*inventory.Slice]int, len(before))
				for k, b := range before {
					at[b] = k
				}
			}
			j, ok = at[sl]
		}
		if ok && beforeKept[j] != nil {
			kept[i] = beforeKept[j]
			continue
		}
		kept[i] = &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: sl.Name}, Spec: sl.Spec.Published()}
	}
	return kept
}
