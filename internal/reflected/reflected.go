// Package reflected keeps a cache of one kind that a client-go Reflector fills straight into a
// store of its own, telling a handler of each change as it writes it: the webhook's caches, which a
// shared informer would serve with more than they use.
//
// A shared informer adds, for each kind, a queue between the reflector and the store, three
// goroutines, and for each event handler a ring of pending notifications that the initial list
// grows to its length and that never shrinks (0.13 MB at 5,000 objects, a megabyte at 40,000,
// kept for a handler that sets a flag); its reflector is named after the caller's stack, a lookup
// in the binary's tables; and its store is a map with a key string for each object. A Cache has
// none of them: the handler runs on the reflector's goroutine, after the store is written, so it
// must not block; and a cache of a kind that changes seldom may keep its objects in a sorted
// slice (WithSortedStore).
package reflected

import (
	"context"
	"sync/atomic"
	"time"

	"k8s.io/client-go/tools/cache"
)

// Cache is what a Reflector lists and watches of one kind, each object passed through a transform.
type Cache struct {
	store     store
	reflector *cache.Reflector
	transform cache.TransformFunc
	handler   cache.ResourceEventHandler
	synced    atomic.Bool
}

type options struct {
	transform cache.TransformFunc
	indexers  cache.Indexers
	sorted    bool
	handler   cache.ResourceEventHandler
	resync    time.Duration
}

// Option configures a Cache.
type Option func(*options)

// WithTransform has each object kept as t returns it; a watch event's too.
func WithTransform(t cache.TransformFunc) Option { return func(o *options) { o.transform = t } }

// WithIndexers indexes the kept objects (ByIndex) in client-go's store.
func WithIndexers(ix cache.Indexers) Option { return func(o *options) { o.indexers = ix } }

// WithSortedStore keeps the objects, which must be Named, in a slice sorted by namespace and name
// instead of client-go's map: 16 bytes an object instead of about 73, but an object added or
// deleted moves those after it. For kinds that change seldom (slices, nodes, classes), not for
// claims, which change all the time. Indexers take precedence.
func WithSortedStore() Option { return func(o *options) { o.sorted = true } }

// WithHandler tells h of each change, as a shared informer's handler would be told: an add, an
// update (old and new as kept), a delete (a cache.DeletedFinalStateUnknown for an object gone
// between two lists), and after each list every object as added or updated.
func WithHandler(h cache.ResourceEventHandler) Option { return func(o *options) { o.handler = h } }

// WithResyncPeriod hands the handler every kept object as updated (unchanged) every d; 0, the
// default, never. The reflector resyncs on a goroutine of its own: the handler is then told
// concurrently with the watch's changes, and must be safe for that.
func WithResyncPeriod(d time.Duration) Option { return func(o *options) { o.resync = d } }

// New caches what lw lists and watches of expected's kind; name names its reflector in logs.
func New(name string, lw cache.ListerWatcher, expected any, opts ...Option) *Cache {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	var st store
	if o.sorted && len(o.indexers) == 0 {
		st = &sorted{}
	} else {
		ix := o.indexers
		if ix == nil {
			ix = cache.Indexers{}
		}
		st = cache.NewIndexer(cache.MetaNamespaceKeyFunc, ix)
	}
	c := &Cache{store: st, transform: o.transform, handler: o.handler}
	c.reflector = cache.NewReflectorWithOptions(lw, expected, c, cache.ReflectorOptions{Name: name, ResyncPeriod: o.resync})
	return c
}

// Run lists and watches until ctx ends.
func (c *Cache) Run(ctx context.Context) { c.reflector.RunWithContext(ctx) }

// HasSynced reports whether the first list is in the cache (its handler may still be told of it).
func (c *Cache) HasSynced() bool { return c.synced.Load() }

// List returns the kept objects.
func (c *Cache) List() []any { return c.store.List() }

// GetByKey returns the kept object of key (namespace/name, or name).
func (c *Cache) GetByKey(key string) (any, bool, error) { return c.store.GetByKey(key) }

// ByIndex returns the kept objects whose index named indexName holds value.
func (c *Cache) ByIndex(indexName, value string) ([]any, error) {
	return c.store.ByIndex(indexName, value)
}

// The reflector writes through the methods below.
var _ cache.TransformingStore = (*Cache)(nil)

func (c *Cache) kept(obj any) (any, error) {
	if c.transform == nil {
		return obj, nil
	}
	return c.transform(obj)
}

func (c *Cache) Add(obj any) error { return c.Update(obj) }

func (c *Cache) Update(obj any) error {
	obj, err := c.kept(obj)
	if err != nil {
		return err
	}
	old, existed, err := c.store.Get(obj)
	if err != nil {
		return err
	}
	if err := c.store.Update(obj); err != nil {
		return err
	}
	switch {
	case c.handler == nil:
	case existed:
		c.handler.OnUpdate(old, obj)
	default:
		c.handler.OnAdd(obj, false)
	}
	return nil
}

func (c *Cache) Delete(obj any) error {
	obj, err := c.kept(obj)
	if err != nil {
		return err
	}
	if err := c.store.Delete(obj); err != nil {
		return err
	}
	if c.handler != nil {
		c.handler.OnDelete(obj)
	}
	return nil
}

// Replace keeps list, what a list returned, in place of what was kept, and tells the handler how
// each object changed: added, updated, or deleted while no watch showed it.
func (c *Cache) Replace(list []any, resourceVersion string) error {
	for i, obj := range list {
		kept, err := c.kept(obj)
		if err != nil {
			return err
		}
		list[i] = kept
	}
	var before map[string]any
	if c.handler != nil {
		objs := c.store.List()
		before = make(map[string]any, len(objs))
		for _, obj := range objs {
			if key, err := keyOf(obj); err == nil {
				before[key] = obj
			}
		}
	}
	if err := c.store.Replace(list, resourceVersion); err != nil {
		return err
	}
	initial := !c.synced.Swap(true)
	if c.handler != nil {
		for _, obj := range list {
			key, err := keyOf(obj)
			if old, ok := before[key]; ok && err == nil {
				delete(before, key)
				c.handler.OnUpdate(old, obj)
				continue
			}
			c.handler.OnAdd(obj, initial)
		}
		for key, obj := range before {
			c.handler.OnDelete(cache.DeletedFinalStateUnknown{Key: key, Obj: obj})
		}
	}
	return nil
}

// Resync hands the handler every kept object as updated to itself.
func (c *Cache) Resync() error {
	if c.handler == nil {
		return nil
	}
	for _, obj := range c.store.List() {
		c.handler.OnUpdate(obj, obj)
	}
	return nil
}

// Transformer lets the reflector transform what a streamed initial list (WatchList) gathers in
// its temporary store as this cache would.
func (c *Cache) Transformer() cache.TransformFunc { return c.transform }
