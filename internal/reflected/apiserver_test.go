package reflected

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// lockedRecorder is a recorder the test reads while the reflector's goroutine writes it.
type lockedRecorder struct {
	mu sync.Mutex
	r  recorder
}

func (l *lockedRecorder) OnAdd(obj any, initial bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.r.OnAdd(obj, initial)
}

func (l *lockedRecorder) OnUpdate(oldObj, newObj any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.r.OnUpdate(oldObj, newObj)
}

func (l *lockedRecorder) OnDelete(obj any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.r.OnDelete(obj)
}

func (l *lockedRecorder) told() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.r.told)
}

// TestCacheAgainstAPIServer: against a real API server, a Cache lists, then watches, and tells
// its handler of each create, update and delete, transformed, in the order they were written.
func TestCacheAgainstAPIServer(t *testing.T) {
	srv := testapiserver.Start(t)
	ctx := t.Context()
	// A namespace of its own: nothing else writes config maps to it.
	if _, err := srv.Clientset.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cms := srv.Clientset.CoreV1().ConfigMaps(testNamespace)
	if _, err := cms.Create(ctx, named(configMap("a", "1")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rec := &lockedRecorder{}
	c := New("ConfigMaps", &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return cms.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return cms.Watch(ctx, o)
		},
	}, &v1.ConfigMap{}, WithTransform(dropAnnotations), WithHandler(rec))
	go c.Run(ctx)
	waitFor(t, "the initial list", c.HasSynced)
	b, err := cms.Create(ctx, named(configMap("b", "1")), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.Data["v"] = "2"
	if _, err := cms.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cms.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []string{"add cache-test/a=1 initial=true", "add cache-test/b=1 initial=false", "update cache-test/b=1 -> cache-test/b=2", "delete cache-test/a=1"}
	waitFor(t, "the writes told", func() bool { return len(rec.told()) >= len(want) })
	if got := rec.told(); !slices.Equal(got, want) {
		t.Errorf("told:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	for _, obj := range c.List() {
		if cm := obj.(*v1.ConfigMap); cm.Annotations != nil {
			t.Errorf("%s kept with its annotations", describe(cm))
		}
	}
	if len(c.List()) != 1 {
		t.Errorf("%d config maps kept, want 1", len(c.List()))
	}
}

const testNamespace = "cache-test"

// named is cm in the namespace the test writes to.
func named(cm *v1.ConfigMap) *v1.ConfigMap {
	cm.Namespace = testNamespace
	return cm
}

func waitFor(t *testing.T, what string, done func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !done(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after a minute", what)
		}
	}
}
