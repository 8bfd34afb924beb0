package published

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

// TestInformersListInPages: against a real API server, with more slices than one page holds and in
// whichever resource.k8s.io version it serves, the informers cache every slice, transformed, with
// the spec as created.
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
			if len(objs.Slices) != n {
				t.Fatalf("%d slices cached, want %d", len(objs.Slices), n)
			}
			for _, s := range objs.Slices {
				if s.Annotations != nil || s.ManagedFields != nil {
					t.Fatalf("slice %s cached with its metadata: %+v", s.Name, s.ObjectMeta)
				}
				want := nodeSlice(t, *s.Spec.NodeName, nodegroups.GroupSpec{})
				if !apiequality.Semantic.DeepEqual(s.Spec.Devices, want.Spec.Devices) {
					t.Fatalf("slice %s: devices differ from those created", s.Name)
				}
			}
		})
	}
}
