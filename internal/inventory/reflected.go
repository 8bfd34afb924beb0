package inventory

import (
	"context"
	"sync/atomic"

	"k8s.io/client-go/tools/cache"
)

// reflected is a cache of one kind that a client-go Reflector fills straight into a store of its
// own, for the kinds the checks only list and whose every change only invalidates what was built
// from them (slices and nodes). A shared informer adds, for each kind, a queue between the
// reflector and the store, three goroutines, and for each event handler a ring of pending
// notifications that the initial list grows to its length and that never shrinks: 0.13 MB at
// 5,000 objects, kept for a handler that sets a flag. Its reflector is also named after the
// caller's stack (a lookup in the binary's tables); this one is named.
type reflected struct {
	store     cache.Store
	reflector *cache.Reflector
	transform cache.TransformFunc
	// changed reports whether an update changed what the checks read; nil: every update does.
	changed  func(oldObj, newObj any) bool
	onChange func()
	synced   atomic.Bool
}

// newReflected caches what lw lists and watches, each object passed through transform, and calls
// onChange after every add, delete, replacing list and update that changed says changed.
func newReflected(name string, lw cache.ListerWatcher, expected any, transform cache.TransformFunc, changed func(oldObj, newObj any) bool, onChange func()) *reflected {
	r := &reflected{store: cache.NewStore(cache.MetaNamespaceKeyFunc), transform: transform, changed: changed, onChange: onChange}
	r.reflector = cache.NewReflectorWithOptions(lw, expected, r, cache.ReflectorOptions{Name: name})
	return r
}

// RunWithContext lists and watches until ctx ends.
func (r *reflected) RunWithContext(ctx context.Context) { r.reflector.RunWithContext(ctx) }

// HasSynced reports whether the first list is in the store.
func (r *reflected) HasSynced() bool { return r.synced.Load() }

// List returns the cached objects.
func (r *reflected) List() []any { return r.store.List() }

func (r *reflected) notify() {
	if r.onChange != nil {
		r.onChange()
	}
}

// The reflector writes through the methods below: into r's store, each object transformed and
// each change told.
var _ cache.TransformingStore = (*reflected)(nil)

func (r *reflected) kept(obj any) (any, error) {
	if r.transform == nil {
		return obj, nil
	}
	return r.transform(obj)
}

func (r *reflected) Add(obj any) error { return r.write(obj, r.store.Add) }

func (r *reflected) Delete(obj any) error { return r.write(obj, r.store.Delete) }

// write transforms obj, hands it to op and tells the change.
func (r *reflected) write(obj any, op func(any) error) error {
	obj, err := r.kept(obj)
	if err != nil {
		return err
	}
	if err := op(obj); err != nil {
		return err
	}
	r.notify()
	return nil
}

func (r *reflected) Update(obj any) error {
	obj, err := r.kept(obj)
	if err != nil {
		return err
	}
	old, existed, err := r.store.Get(obj)
	if err != nil {
		return err
	}
	if err := r.store.Update(obj); err != nil {
		return err
	}
	if !existed || r.changed == nil || r.changed(old, obj) {
		r.notify()
	}
	return nil
}

func (r *reflected) Replace(list []any, resourceVersion string) error {
	for i, obj := range list {
		kept, err := r.kept(obj)
		if err != nil {
			return err
		}
		list[i] = kept
	}
	if err := r.store.Replace(list, resourceVersion); err != nil {
		return err
	}
	r.synced.Store(true)
	r.notify()
	return nil
}

// Resync has nothing to do: there is no handler to hand the cache to again.
func (r *reflected) Resync() error { return nil }

// Transformer lets the reflector transform what a streamed initial list (WatchList) gathers in
// its temporary store as this store would.
func (r *reflected) Transformer() cache.TransformFunc { return r.transform }
