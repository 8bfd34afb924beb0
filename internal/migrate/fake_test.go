package migrate_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/dynamic"
	fakedynamic "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"
)

var svmGVR = schema.GroupVersionResource{Group: "storagemigration.k8s.io", Version: "v1", Resource: "storageversionmigrations"}

// kinds are the resource.k8s.io/v1 resources the fake cluster serves, with their kinds.
var kinds = map[string]string{
	"deviceclasses":          "DeviceClass",
	"resourceclaims":         "ResourceClaim",
	"resourceclaimtemplates": "ResourceClaimTemplate",
	"resourceslices":         "ResourceSlice",
}

func gvr(resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: resource}
}

// fakeDiscovery serves resource.k8s.io v1 (with a status subresource and a resource that cannot
// be updated, neither of which is migrated) and, unless svmVersion is empty, storagemigration.k8s.io.
func fakeDiscovery(svmVersion string) *fakediscovery.FakeDiscovery {
	verbs := metav1.Verbs{"create", "delete", "get", "list", "patch", "update", "watch"}
	resources := []metav1.APIResource{
		{Name: "resourceclaims/status", Kind: "ResourceClaim", Verbs: metav1.Verbs{"get", "patch", "update"}},
		{Name: "readonlythings", Kind: "ReadOnlyThing", Verbs: metav1.Verbs{"get", "list"}},
	}
	for name, kind := range kinds {
		resources = append(resources, metav1.APIResource{Name: name, Kind: kind, Namespaced: strings.HasPrefix(name, "resourceclaim"), Verbs: verbs})
	}
	lists := []*metav1.APIResourceList{
		{GroupVersion: "resource.k8s.io/v1", APIResources: resources},
		{GroupVersion: "resource.k8s.io/v1beta1", APIResources: resources},
	}
	if svmVersion != "" {
		lists = append(lists, &metav1.APIResourceList{GroupVersion: "storagemigration.k8s.io/" + svmVersion,
			APIResources: []metav1.APIResource{{Name: "storageversionmigrations", Kind: "StorageVersionMigration", Verbs: verbs}}})
	}
	return &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{Resources: lists}}
}

// object is a stored resource.k8s.io/v1 object; namespace "" for cluster-scoped kinds.
func object(resource, namespace, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("resource.k8s.io/v1")
	u.SetKind(kinds[resource])
	u.SetNamespace(namespace)
	u.SetName(name)
	u.SetResourceVersion("10")
	return u
}

// fakeServer answers updates of resource.k8s.io objects as kube-apiserver does for an unchanged
// object: stored anew (a new resourceVersion) when it was in an older version ("stale-*"), else
// not stored at all. Injected faults come first.
type fakeServer struct {
	// client is what the migration uses: fake, with updates timed. The fake client runs one
	// reactor at a time, so updates in flight are counted before they reach it.
	client dynamic.Interface
	fake   *fakedynamic.FakeDynamicClient

	mu        sync.Mutex
	conflicts map[string]int // name: conflicts still to answer
	gone      map[string]bool
	refused   map[string]bool
	updates   map[string]int
	gets      map[string]int

	delay       time.Duration
	inFlight    atomic.Int32
	maxInFlight atomic.Int32
}

func newFakeServer(objects ...runtime.Object) *fakeServer {
	listKinds := map[schema.GroupVersionResource]string{svmGVR: "StorageVersionMigrationList"}
	for resource, kind := range kinds {
		listKinds[gvr(resource)] = kind + "List"
	}
	s := &fakeServer{
		fake:      fakedynamic.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), listKinds, objects...),
		conflicts: map[string]int{}, gone: map[string]bool{}, refused: map[string]bool{},
		updates: map[string]int{}, gets: map[string]int{},
	}
	s.client = timedClient{s.fake, s}
	s.fake.PrependReactor("update", "*", s.update)
	s.fake.PrependReactor("get", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.gets[a.(clienttesting.GetAction).GetName()]++
		return false, nil, nil
	})
	return s
}

// timed counts the updates in flight, each taking delay.
func (s *fakeServer) timed() func() {
	n := s.inFlight.Add(1)
	for {
		m := s.maxInFlight.Load()
		if n <= m || s.maxInFlight.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(s.delay)
	return func() { s.inFlight.Add(-1) }
}

type timedClient struct {
	dynamic.Interface
	s *fakeServer
}

func (c timedClient) Resource(r schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	return timedResource{c.Interface.Resource(r), c.s}
}

type timedResource struct {
	dynamic.NamespaceableResourceInterface
	s *fakeServer
}

func (r timedResource) Namespace(ns string) dynamic.ResourceInterface {
	return timedNamespaced{r.NamespaceableResourceInterface.Namespace(ns), r.s}
}

type timedNamespaced struct {
	dynamic.ResourceInterface
	s *fakeServer
}

func (r timedNamespaced) Update(ctx context.Context, obj *unstructured.Unstructured, opts metav1.UpdateOptions, sub ...string) (*unstructured.Unstructured, error) {
	defer r.s.timed()()
	return r.ResourceInterface.Update(ctx, obj, opts, sub...)
}

func (s *fakeServer) update(a clienttesting.Action) (bool, runtime.Object, error) {
	obj := a.(clienttesting.UpdateAction).GetObject().(*unstructured.Unstructured).DeepCopy()
	name := obj.GetName()
	gr := a.GetResource().GroupResource()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.updates[name]++
	switch {
	case s.gone[name]:
		return true, nil, apierrors.NewNotFound(gr, name)
	case s.conflicts[name] > 0:
		s.conflicts[name]--
		return true, nil, apierrors.NewConflict(gr, name, fmt.Errorf("the object has been modified"))
	case s.refused[name]:
		return true, nil, apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: obj.GetKind()}, name,
			field.ErrorList{field.Invalid(field.NewPath("spec"), "x", "no longer valid")})
	case strings.HasPrefix(name, "stale-"):
		obj.SetResourceVersion(obj.GetResourceVersion() + "1")
	}
	return true, obj, nil
}

// migrations answers StorageVersionMigrations as a migrator controller would: each is created
// with a generated name and, once any has been read polls times, carries condition (none: no
// controller).
type migrations struct {
	mu        sync.Mutex
	created   []*unstructured.Unstructured
	deleted   []string
	gets      int
	polls     int
	condition string
}

func (m *migrations) install(c *fakedynamic.FakeDynamicClient) {
	c.PrependReactor("create", "storageversionmigrations", func(a clienttesting.Action) (bool, runtime.Object, error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		obj := a.(clienttesting.CreateAction).GetObject().(*unstructured.Unstructured).DeepCopy()
		obj.SetName(fmt.Sprintf("%s%d", obj.GetGenerateName(), len(m.created)))
		m.created = append(m.created, obj)
		return true, obj, nil
	})
	c.PrependReactor("get", "storageversionmigrations", func(a clienttesting.Action) (bool, runtime.Object, error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.gets++
		var obj *unstructured.Unstructured
		for _, c := range m.created {
			if c.GetName() == a.(clienttesting.GetAction).GetName() {
				obj = c.DeepCopy()
			}
		}
		if obj == nil {
			return true, nil, apierrors.NewNotFound(a.GetResource().GroupResource(), a.(clienttesting.GetAction).GetName())
		}
		if m.condition != "" && m.gets > m.polls {
			cond := map[string]any{"type": m.condition, "status": "True", "reason": m.condition, "message": "migrator says " + m.condition,
				"lastTransitionTime": "2026-01-01T00:00:00Z"}
			obj.Object["status"] = map[string]any{"conditions": []any{cond}}
		}
		return true, obj, nil
	})
	c.PrependReactor("delete", "storageversionmigrations", func(a clienttesting.Action) (bool, runtime.Object, error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.deleted = append(m.deleted, a.(clienttesting.DeleteAction).GetName())
		return true, nil, nil
	})
}
