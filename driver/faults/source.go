package faults

import (
	"context"
	"maps"
	"sync"

	"k8s.io/klog/v2"
)

// Source reports the faults of one node's devices. A hardware backend (NVML events, a polling
// prober) implements it as the simulated ConfigMapSource does: Run calls report with the node's
// complete set of faults whenever it changes, until ctx ends, and returns nil then. report is
// never called concurrently; a device absent from a set is healthy.
type Source interface {
	Run(ctx context.Context, report func(Faults)) error
}

// Tracker keeps a Source's current faults for the plugin's consumers: the taint publisher, the
// kubelet's health streams, metrics and Events. Listeners run in the Source's goroutine, in the
// order they were added, with the set before and after each change.
type Tracker struct {
	source Source

	mu        sync.Mutex
	faults    Faults
	listeners []func(ctx context.Context, before, after Faults)
	subs      map[chan struct{}]struct{}
}

// NewTracker returns a Tracker of source; no device is faulty until the source says so.
func NewTracker(source Source) *Tracker {
	return &Tracker{source: source, faults: Faults{}, subs: map[chan struct{}]struct{}{}}
}

// OnChange adds a listener; add them before Run.
func (t *Tracker) OnChange(f func(ctx context.Context, before, after Faults)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.listeners = append(t.listeners, f)
}

// Run runs the source until ctx ends.
func (t *Tracker) Run(ctx context.Context) error {
	return t.source.Run(ctx, func(faults Faults) { t.set(ctx, faults) })
}

func (t *Tracker) set(ctx context.Context, faults Faults) {
	t.mu.Lock()
	before := t.faults
	if before.Equal(faults) {
		t.mu.Unlock()
		return
	}
	t.faults = maps.Clone(faults)
	listeners := t.listeners
	for ch := range t.subs {
		select {
		case ch <- struct{}{}:
		default: // a change is already pending for this subscriber
		}
	}
	t.mu.Unlock()
	klog.FromContext(ctx).Info("Device faults changed", "faulty", len(faults), "before", len(before))
	for _, l := range listeners {
		l(ctx, before, maps.Clone(faults))
	}
}

// Faults returns the current faults (a copy).
func (t *Tracker) Faults() Faults {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.faults)
}

// Subscribe returns a channel that receives a value after each change (changes in between are
// merged) and a function that ends the subscription.
func (t *Tracker) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	t.mu.Lock()
	t.subs[ch] = struct{}{}
	t.mu.Unlock()
	return ch, func() {
		t.mu.Lock()
		delete(t.subs, ch)
		t.mu.Unlock()
	}
}
