package reflected

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// recorder writes down what a handler is told, one line per call.
type recorder struct{ told []string }

func (r *recorder) OnAdd(obj any, initial bool) {
	r.told = append(r.told, fmt.Sprintf("add %s initial=%t", describe(obj), initial))
}

func (r *recorder) OnUpdate(oldObj, newObj any) {
	r.told = append(r.told, fmt.Sprintf("update %s -> %s", describe(oldObj), describe(newObj)))
}

func (r *recorder) OnDelete(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		r.told = append(r.told, fmt.Sprintf("delete unknown %s %s", t.Key, describe(t.Obj)))
		return
	}
	r.told = append(r.told, "delete "+describe(obj))
}

// describe is a config map as "ns/name=value" of its data's key "v".
func describe(obj any) string {
	cm, ok := obj.(*v1.ConfigMap)
	if !ok {
		return fmt.Sprintf("%T", obj)
	}
	return cm.Namespace + "/" + cm.Name + "=" + cm.Data["v"]
}

func configMap(name, value string) *v1.ConfigMap {
	return &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Annotations: map[string]string{"dropped": "by the transform"}},
		Data: map[string]string{"v": value}}
}

// dropAnnotations is the transform of the tests: what is kept has no annotations.
func dropAnnotations(obj any) (any, error) {
	cm, ok := obj.(*v1.ConfigMap)
	if !ok {
		return obj, nil
	}
	cm = cm.DeepCopy()
	cm.Annotations = nil
	return cm, nil
}

// TestCacheTellsChanges: what the reflector writes is kept transformed, and the handler is told
// of each change as a shared informer's would be: a list as adds (initial only the first time),
// updates of what was kept, deletions, including as tombstones those a later list no longer has.
func TestCacheTellsChanges(t *testing.T) {
	type op func(c *Cache) error
	replace := func(objs ...any) op {
		return func(c *Cache) error { return c.Replace(objs, "1") }
	}
	add := func(o any) op { return func(c *Cache) error { return c.Add(o) } }
	update := func(o any) op { return func(c *Cache) error { return c.Update(o) } }
	del := func(o any) op { return func(c *Cache) error { return c.Delete(o) } }
	resync := func(c *Cache) error { return c.Resync() }
	tests := []struct {
		name string
		ops  []op
		told []string
		kept []string
	}{{
		name: "initial list",
		ops:  []op{replace(configMap("a", "1"), configMap("b", "1"))},
		told: []string{"add ns/a=1 initial=true", "add ns/b=1 initial=true"},
		kept: []string{"ns/a=1", "ns/b=1"},
	}, {
		name: "watch events",
		ops:  []op{replace(configMap("a", "1")), add(configMap("b", "1")), update(configMap("a", "2")), del(configMap("b", "1"))},
		told: []string{"add ns/a=1 initial=true", "add ns/b=1 initial=false", "update ns/a=1 -> ns/a=2", "delete ns/b=1"},
		kept: []string{"ns/a=2"},
	}, {
		name: "an add of what is kept is an update, an update of what is not an add",
		ops:  []op{replace(configMap("a", "1")), add(configMap("a", "2")), update(configMap("b", "1"))},
		told: []string{"add ns/a=1 initial=true", "update ns/a=1 -> ns/a=2", "add ns/b=1 initial=false"},
		kept: []string{"ns/a=2", "ns/b=1"},
	}, {
		name: "a relist tells what changed meanwhile",
		ops: []op{replace(configMap("a", "1"), configMap("b", "1")),
			replace(configMap("a", "2"), configMap("c", "1"))},
		told: []string{"add ns/a=1 initial=true", "add ns/b=1 initial=true",
			"update ns/a=1 -> ns/a=2", "add ns/c=1 initial=false", "delete unknown ns/b ns/b=1"},
		kept: []string{"ns/a=2", "ns/c=1"},
	}, {
		name: "resync hands every object as updated to itself",
		ops:  []op{replace(configMap("a", "1")), resync},
		told: []string{"add ns/a=1 initial=true", "update ns/a=1 -> ns/a=1"},
		kept: []string{"ns/a=1"},
	}}
	stores := []struct {
		name string
		opts []Option
	}{{"client-go's store", nil}, {"sorted store", []Option{WithSortedStore()}}}
	for _, st := range stores {
		for _, tc := range tests {
			t.Run(st.name+"/"+tc.name, func(t *testing.T) {
				r := &recorder{}
				c := New("test", nil, &v1.ConfigMap{}, append([]Option{WithTransform(dropAnnotations), WithHandler(r)}, st.opts...)...)
				if c.HasSynced() {
					t.Fatal("synced before any list")
				}
				for i, op := range tc.ops {
					if err := op(c); err != nil {
						t.Fatalf("op %d: %v", i, err)
					}
				}
				if !c.HasSynced() {
					t.Error("not synced after a list")
				}
				if !slices.Equal(r.told, tc.told) {
					t.Errorf("told:\n  %s\nwant:\n  %s", strings.Join(r.told, "\n  "), strings.Join(tc.told, "\n  "))
				}
				var kept []string
				for _, obj := range c.List() {
					if cm := obj.(*v1.ConfigMap); cm.Annotations != nil {
						t.Errorf("%s kept with its annotations: the transform was not applied", describe(cm))
					}
					kept = append(kept, describe(obj))
				}
				slices.Sort(kept)
				if !slices.Equal(kept, tc.kept) {
					t.Errorf("kept %q, want %q", kept, tc.kept)
				}
			})
		}
	}
}

// TestCacheIndexes: the indexers given are kept up to date with every write.
func TestCacheIndexes(t *testing.T) {
	c := New("test", nil, &v1.ConfigMap{}, WithIndexers(cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}))
	other := configMap("b", "1")
	other.Namespace = "other"
	if err := c.Replace([]any{configMap("a", "1"), other}, "1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(configMap("a", "1")); err != nil {
		t.Fatal(err)
	}
	if err := c.Add(configMap("c", "1")); err != nil {
		t.Fatal(err)
	}
	objs, err := c.ByIndex(cache.NamespaceIndex, "ns")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 || describe(objs[0]) != "ns/c=1" {
		t.Errorf("namespace ns indexes %d objects, want only ns/c", len(objs))
	}
	if obj, ok, err := c.GetByKey("other/b"); err != nil || !ok || describe(obj) != "other/b=1" {
		t.Errorf("GetByKey(other/b) = %v, %t, %v", obj, ok, err)
	}
}
