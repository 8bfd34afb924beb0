package reflected

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/gpu-dra/gpu-dra/internal/allocs"
)

// TestSortedAsClientGoStore: every sequence of writes leaves the sorted store holding, and
// answering Get, GetByKey and List with, what client-go's store does after the same writes.
func TestSortedAsClientGoStore(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, seed))
			obj := func() *v1.ConfigMap {
				cm := configMap(fmt.Sprint("cm-", rng.IntN(30)), fmt.Sprint(rng.IntN(1000)))
				cm.Namespace = fmt.Sprint("ns-", rng.IntN(3))
				if rng.IntN(4) == 0 {
					cm.Namespace = "" // cluster-scoped objects sort with the others
				}
				return cm
			}
			got, want := &sorted{}, cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			for step := range 400 {
				var op string
				var err1, err2 error
				switch n := rng.IntN(20); {
				case n < 12:
					o := obj()
					op, err1, err2 = "update "+describe(o), got.Update(o), want.Update(o)
				case n < 18:
					o := obj()
					op, err1, err2 = "delete "+describe(o), got.Delete(o), want.Delete(o)
				default:
					list := make([]any, rng.IntN(40))
					for i := range list {
						list[i] = obj() // names repeat: the later object of a name is kept
					}
					op, err1, err2 = fmt.Sprintf("replace with %d objects", len(list)), got.Replace(slices.Clone(list), "1"), want.Replace(list, "1")
				}
				if err1 != nil || err2 != nil {
					t.Fatalf("step %d, %s: %v, client-go's: %v", step, op, err1, err2)
				}
				if g, w := kept(got.List()), kept(want.List()); !slices.Equal(g, w) {
					t.Fatalf("step %d, after %s: kept\n  %q\nclient-go's store keeps\n  %q", step, op, g, w)
				}
				probe := obj()
				key, _ := cache.MetaNamespaceKeyFunc(probe)
				if k, err := keyOf(probe); k != key || err != nil {
					t.Fatalf("keyOf(%s) = %q, %v; client-go's key %q", describe(probe), k, err, key)
				}
				g1, ok1, _ := got.Get(probe)
				g2, ok2, _ := got.GetByKey(key)
				w1, okw, _ := want.GetByKey(key)
				if ok1 != okw || ok2 != okw || (okw && (g1 != w1 || g2 != w1)) {
					t.Fatalf("step %d, after %s: %s found %t/%t, client-go's store %t", step, op, key, ok1, ok2, okw)
				}
			}
		})
	}
}

// kept describes objs, sorted.
func kept(objs []any) []string {
	out := make([]string, len(objs))
	for i, o := range objs {
		out[i] = describe(o)
	}
	slices.Sort(out)
	return out
}

// TestSortedRefusesUnnamed: an object that cannot tell its name is an error, not a panic.
func TestSortedRefusesUnnamed(t *testing.T) {
	s := &sorted{}
	for name, err := range map[string]error{
		"Update":  s.Update(struct{}{}),
		"Delete":  s.Delete(42),
		"Replace": s.Replace([]any{configMap("a", "1"), "not an object"}, "1"),
	} {
		if err == nil {
			t.Errorf("%s of an object without a name: no error", name)
		}
	}
	if _, _, err := s.Get(struct{}{}); err == nil {
		t.Error("Get of an object without a name: no error")
	}
	if _, err := s.ByIndex(cache.NamespaceIndex, "ns"); err == nil {
		t.Error("ByIndex without indexers: no error")
	}
}

// TestSortedKeepsLess: what the sorted store keeps of 40,000 namespaced objects is its slice, 16
// bytes an object, where client-go's store keeps a map and a key string for each.
func TestSortedKeepsLess(t *testing.T) {
	const n = 40_000
	objs := make([]any, n)
	for i := range objs {
		objs[i] = &metav1.ObjectMeta{Namespace: fmt.Sprint("team-", i%200), Name: fmt.Sprint("claim-", i)}
	}
	ours := allocs.Retained(func() any {
		s := &sorted{}
		if err := s.Replace(slices.Clone(objs), "1"); err != nil {
			t.Fatal(err)
		}
		return s
	})
	theirs := allocs.Retained(func() any {
		s := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
		if err := s.Replace(slices.Clone(objs), "1"); err != nil {
			t.Fatal(err)
		}
		return s
	})
	t.Logf("kept for %d objects: %d bytes (%.1f an object), client-go's store %d (%.1f)", n, ours, float64(ours)/n, theirs, float64(theirs)/n)
	if ours > n*16+16<<10 { // a large allocation is rounded up to whole pages
		t.Errorf("the sorted store keeps %d bytes for %d objects, want at most 16 an object", ours, n)
	}
	if ours*4 > theirs {
		t.Errorf("the sorted store keeps %d bytes, client-go's %d: want under a quarter", ours, theirs)
	}
}
