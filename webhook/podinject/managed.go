package podinject

import (
	"context"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/internal/listing"
	"github.com/gpu-dra/gpu-dra/internal/reflected"
)

// DefaultMaxTemplatesPerNamespace bounds the managed templates of one namespace: each distinct
// count, model and memory a pod asks for needs its own, and the model annotation takes any string.
const DefaultMaxTemplatesPerNamespace = 64

// managedTemplates is what the cluster holds of the webhook's templates, from an informer over
// those labelled managed-by and named as the webhook names them (in any served resource.k8s.io
// version, as v1), of each only a digest of its spec (templateDigest), plus the creations still on
// their way into it. It counts them per namespace for the bound, tells whether a template
// exists and what it says, and reports deletions.
type managedTemplates struct {
	cache *reflected.Cache
	max   int

	mu sync.Mutex
	// deleted is told of each managed template deleted from the cluster (onDelete).
	deleted func(namespace, name string)
	// pending are templates this replica created or is creating that the informer has not shown
	// yet, by namespace and name, with when they were reserved: without them a burst of distinct
	// requests would all pass the bound before the first creation came back through the watch.
	pending map[string]map[string]time.Time
}

// pendingTTL forgets a reservation the informer never confirmed (a template created and deleted
// between two relists): far longer than a watch event takes.
const pendingTTL = time.Minute

func newManagedTemplates(dra *draclient.Client, maxPerNamespace int) *managedTemplates {
	selector := ManagedByLabel + "=" + ManagedBy
	templates := dra.ResourceClaimTemplates(metav1.NamespaceAll)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return listDigests(ctx, o, templates.List)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			w, err := templates.Watch(ctx, o)
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, digestEvent), nil
		},
	}
	m := &managedTemplates{max: maxPerNamespace, pending: map[string]map[string]time.Time{}}
	// A reservation ends as soon as the watch shows its template: from then on the cache counts
	// it, and once it is deleted nothing holds its place in the bound (waiting for the next reserve
	// in the namespace to notice kept a deleted template counted until pendingTTL).
	m.cache = reflected.New("managed ResourceClaimTemplates", listing.Plain(lw), &templateDigest{},
		reflected.WithIndexers(cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		reflected.WithHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    m.confirmed,
			UpdateFunc: func(_, obj any) { m.confirmed(obj) },
			DeleteFunc: m.gone,
		}))
	return m
}

// confirmed ends the reservation of a template the cache shows.
func (m *managedTemplates) confirmed(obj any) {
	t, ok := obj.(*templateDigest)
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.pending[t.Namespace], t.Name)
	if len(m.pending[t.Namespace]) == 0 {
		delete(m.pending, t.Namespace)
	}
}

// gone tells onDelete's function of a template deleted from the cluster.
func (m *managedTemplates) gone(obj any) {
	m.mu.Lock()
	f := m.deleted
	m.mu.Unlock()
	if f == nil {
		return
	}
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
		if ns, name, err := cache.SplitMetaNamespaceKey(key); err == nil {
			f(ns, name)
		}
	}
}

// onDelete calls f with each managed template deleted from the cluster.
func (m *managedTemplates) onDelete(f func(namespace, name string)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.deleted = f
}

// get returns what the cache has of the managed template, or nil.
func (m *managedTemplates) get(namespace, name string) *templateDigest {
	obj, ok, err := m.cache.GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil
	}
	t, _ := obj.(*templateDigest)
	return t
}

// reserve admits the creation of namespace/name within the bound, or refuses it. release ends the
// reservation of a creation that failed; a successful one stays reserved until the informer shows
// it.
func (m *managedTemplates) reserve(namespace, name string) (release func(), err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	existing, _ := m.cache.ByIndex(cache.NamespaceIndex, namespace)
	names := make(map[string]bool, len(existing))
	for _, obj := range existing {
		if t, ok := obj.(*templateDigest); ok {
			names[t.Name] = true
		}
	}
	pending := m.pending[namespace]
	for n, at := range pending {
		if names[n] || time.Since(at) > pendingTTL {
			delete(pending, n)
			continue
		}
		names[n] = true
	}
	if !names[name] && len(names) >= m.max {
		return nil, &RefusedError{Reason: fmt.Sprintf(
			"namespace %s has %d ResourceClaimTemplates managed by %s, the most the webhook creates in one namespace (each distinct count, model and memory annotation needs its own); ask for GPUs the way existing pods do, or delete templates no pod uses (kubectl -n %s get resourceclaimtemplates -l %s=%s)",
			namespace, len(names), ManagedBy, namespace, ManagedByLabel, ManagedBy)}
	}
	if pending == nil {
		pending = map[string]time.Time{}
		m.pending[namespace] = pending
	}
	pending[name] = time.Now()
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.pending[namespace], name)
		if len(m.pending[namespace]) == 0 {
			delete(m.pending, namespace)
		}
	}, nil
}

// run lists and watches until ctx ends.
func (m *managedTemplates) run(ctx context.Context) {
	klog.FromContext(ctx).V(2).Info("Watching managed ResourceClaimTemplates")
	m.cache.Run(ctx)
}
