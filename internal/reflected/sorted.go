package reflected

import (
	"cmp"
	"fmt"
	"slices"
	"sync"

	"k8s.io/client-go/tools/cache"
)

// Named is what a kept object tells of itself without allocating: every API type does (through its
// ObjectMeta), and so must a transform's own types.
type Named interface {
	GetNamespace() string
	GetName() string
}

// sorted is the store of a Cache WithSortedStore: the kept objects in a slice ordered by namespace
// and name, found by binary search. client-go's store keeps a map from "namespace/name" to the
// object: at 5,000 slices a table of 8,192 slots of 32 bytes, and a key string for each object of
// a namespace besides. This keeps 16 bytes an object and makes no key.
type sorted struct {
	mu   sync.RWMutex
	objs []any
}

// store is what a Cache reads and writes of its store; cache.Indexer is one.
type store interface {
	Get(obj any) (any, bool, error)
	GetByKey(key string) (any, bool, error)
	Update(obj any) error
	Delete(obj any) error
	Replace(list []any, resourceVersion string) error
	List() []any
	ByIndex(indexName, value string) ([]any, error)
}

var _ store = cache.Indexer(nil)

// nameOf is obj's namespace and name.
func nameOf(obj any) (namespace, name string, err error) {
	n, ok := obj.(Named)
	if !ok {
		return "", "", fmt.Errorf("%T is not a Named object: it cannot be kept", obj)
	}
	return n.GetNamespace(), n.GetName(), nil
}

// keyOf is obj's key as client-go writes it (namespace/name, or name), without reading a Named
// object's metadata through an accessor.
func keyOf(obj any) (string, error) {
	n, ok := obj.(Named)
	if !ok {
		return cache.MetaNamespaceKeyFunc(obj)
	}
	if n.GetNamespace() == "" {
		return n.GetName(), nil
	}
	return n.GetNamespace() + "/" + n.GetName(), nil
}

func compareNamed(a any, namespace, name string) int {
	n := a.(Named) // only Named objects are stored
	if c := cmp.Compare(n.GetNamespace(), namespace); c != 0 {
		return c
	}
	return cmp.Compare(n.GetName(), name)
}

func compareObjects(a, b any) int {
	n := b.(Named)
	return compareNamed(a, n.GetNamespace(), n.GetName())
}

// find (s.mu held) is where namespace/name is or would be.
func (s *sorted) find(namespace, name string) (int, bool) {
	return slices.BinarySearchFunc(s.objs, namespace, func(a any, ns string) int { return compareNamed(a, ns, name) })
}

func (s *sorted) Get(obj any) (any, bool, error) {
	namespace, name, err := nameOf(obj)
	if err != nil {
		return nil, false, err
	}
	return s.get(namespace, name)
}

func (s *sorted) GetByKey(key string) (any, bool, error) {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, false, err
	}
	return s.get(namespace, name)
}

func (s *sorted) get(namespace, name string) (any, bool, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if i, ok := s.find(namespace, name); ok {
		return s.objs[i], true, nil
	}
	return nil, false, nil
}

// Update keeps obj in place of the object of its name, or adds it.
func (s *sorted) Update(obj any) error {
	return s.at(obj, func(i int, found bool) {
		if found {
			s.objs[i] = obj
		} else {
			s.objs = slices.Insert(s.objs, i, obj)
		}
	})
}

func (s *sorted) Delete(obj any) error {
	return s.at(obj, func(i int, found bool) {
		if found {
			s.objs = slices.Delete(s.objs, i, i+1)
		}
	})
}

// at hands op where obj is or would be, under the write lock.
func (s *sorted) at(obj any, op func(i int, found bool)) error {
	namespace, name, err := nameOf(obj)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	op(s.find(namespace, name))
	return nil
}

// Replace keeps list, sorted, as everything kept; of objects of one name the last one.
func (s *sorted) Replace(list []any, _ string) error {
	objs := make([]any, len(list))
	for i, obj := range list {
		if _, _, err := nameOf(obj); err != nil {
			return err
		}
		objs[i] = obj
	}
	slices.SortStableFunc(objs, compareObjects)
	// A list names each object once; should one come twice, the later one is kept, as in a map.
	kept := objs[:0]
	for _, obj := range objs {
		if len(kept) > 0 && compareObjects(kept[len(kept)-1], obj) == 0 {
			kept[len(kept)-1] = obj
			continue
		}
		kept = append(kept, obj)
	}
	clear(objs[len(kept):])
	objs = kept
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objs = objs
	return nil
}

// List returns the kept objects, in a slice of the caller's.
func (s *sorted) List() []any {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.objs)
}

func (s *sorted) ByIndex(indexName, _ string) ([]any, error) {
	return nil, fmt.Errorf("index %q does not exist: the cache was made without indexers", indexName)
}
