package inventory

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	draclient "k8s.io/dynamic-resource-allocation/client"

	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// watchChanges: a slice created, one changed and one deleted after the initial list reach the
// cache through the watch, transformed.
func watchChanges(ctx context.Context, t *testing.T, dra *draclient.Client, inf *Informers) {
	t.Helper()
	added := nodeSlice(t, "node-added", nodegroups.GroupSpec{Model: "L4"})
	added.ObjectMeta = metav1.ObjectMeta{Name: added.Name}
	if _, err := dra.ResourceSlices().Create(ctx, added, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	changed, err := dra.ResourceSlices().Get(ctx, "node-0000-gpu.example.com-abcde", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	changed.Spec.Devices = changed.Spec.Devices[:2]
	if _, err := dra.ResourceSlices().Update(ctx, changed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := dra.ResourceSlices().Delete(ctx, "node-0001-gpu.example.com-abcde", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		objs, err := inf.Published()
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string]*Slice{}
		for _, s := range objs.CompactSlices {
			byName[s.Name] = s
		}
		a, c, deleted := byName[added.Name], byName[changed.Name], byName["node-0001-gpu.example.com-abcde"] == nil
		if a != nil && c != nil && len(c.Spec.Devices) == 2 && deleted {
			if !apiequality.Semantic.DeepEqual(a.Full().Spec.Devices, added.Spec.Devices) {
				t.Fatalf("watched slice %s: devices differ from those created", a.Name)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute: added %t, changed %t, deleted %t", a != nil, c != nil && len(c.Spec.Devices) == 2, deleted)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestInformersListInPages: against a real API server, with more slices than one page holds and in
// whichever resource.k8s.io version it serves, the informers cache every slice, transformed, with
// the spec as created, and then follow the watch.
func TestInformersListInPages(t *testing.T) {
	for _, tc := range []struct{ name, runtimeConfig string }{
		{"v1", testapiserver.AllVersions},
		{"v1beta1-only", testapiserver.V1Beta1Only},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testapiserver.Start(t, testapiserver.WithRuntimeConfig(tc.runtimeConfig))
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			dra := draclient.New(srv.Clientset)
			const n = 2*listPageSize + 50
			g, gctx := errgroup.WithContext(ctx)
			g.SetLimit(16)
			for i := range n {
				g.Go(func() error {
					s := nodeSlice(t, fmt.Sprintf("node-%04d", i), nodegroups.GroupSpec{})
					s.ObjectMeta = metav1.ObjectMeta{Name: s.Name, Annotations: map[string]string{"a": "b"}}
					_, err := dra.ResourceSlices().Create(gctx, s, metav1.CreateOptions{})
					return err
				})
			}
			if err := g.Wait(); err != nil {
				t.Fatal(err)
			}
			inf := NewInformers(srv.Clientset, 0, nil)
			inf.Start(ctx)
			deadline := time.Now().Add(time.Minute)
			for !inf.HasSynced() {
				if time.Now().After(deadline) {
					t.Fatal("informers not synced after a minute")
				}
				time.Sleep(50 * time.Millisecond)
			}
			objs, err := inf.Published()
			if err != nil {
				t.Fatal(err)
			}
			if len(objs.CompactSlices) != n || objs.Slices != nil {
				t.Fatalf("%d slices cached (and %d as published), want %d", len(objs.CompactSlices), len(objs.Slices), n)
			}
			for _, s := range objs.CompactSlices {
				if m := s.Full().ObjectMeta; m.Annotations != nil || m.ManagedFields != nil {
					t.Fatalf("slice %s cached with its metadata: %+v", s.Name, m)
				}
				want := nodeSlice(t, s.Spec.NodeName, nodegroups.GroupSpec{})
				if !apiequality.Semantic.DeepEqual(s.Full().Spec.Devices, want.Spec.Devices) {
					t.Fatalf("slice %s: devices differ from those created", s.Name)
				}
			}
			watchChanges(ctx, t, dra, inf)
		})
	}
}

// TestInformersReleaseDeletedSlices: against a real API server, slices listed at the start and
// created after it, every one with devices of its own, leave the intern tables empty once they
// are all deleted.
func TestInformersReleaseDeletedSlices(t *testing.T) {
	srv := testapiserver.Start(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	dra := draclient.New(srv.Clientset)
	create := func(from, to int) {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(16)
		for i := from; i < to; i++ {
			g.Go(func() error {
				s := uniqueSlice(i, 8)
				s.ObjectMeta = metav1.ObjectMeta{Name: s.Name}
				_, err := dra.ResourceSlices().Create(gctx, s, metav1.CreateOptions{})
				return err
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	const listed, watched = listPageSize + 20, 30
	create(0, listed)
	inf := NewInformers(srv.Clientset, 0, nil)
	inf.Start(ctx)
	create(listed, listed+watched)
	cached := func() int {
		objs, err := inf.Published()
		if err != nil {
			return -1
		}
		return len(objs.CompactSlices)
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after a minute: not %s", what)
			}
		}
	}
	waitFor("every slice cached", func() bool { return cached() == listed+watched })
	if entries, _ := inf.interner.usage(); entries == 0 {
		t.Fatal("nothing interned")
	}
	if err := dra.ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("every slice deleted from the cache", func() bool { return cached() == 0 })
	if entries, bytes, ok := drained(inf.interner, 0, 0); !ok {
		t.Errorf("every slice deleted: tables hold %d entries, %d bytes", entries, bytes)
	}
}
