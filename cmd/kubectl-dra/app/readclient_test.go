package app

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
)

// TestReadClientIsNotThrottled: the lists of a large cluster are many pages, and the read client
// sends them as fast as the API server answers. client-go's default limit (5 requests a second
// after a burst of 10, per API group) would make the 30 pages of each list below take 4 s.
func TestReadClientIsNotThrottled(t *testing.T) {
	const pages = 30
	srv := startProtoServer(t, nil, map[string]*protoList{
		"/apis/resource.k8s.io/v1/resourceclaims": {n: pages, page: func(from, to int) runtime.Object {
			l := &resourceapi.ResourceClaimList{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaimList"}}
			for i := from; i < to; i++ {
				l.Items = append(l.Items, resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("c%d", i)}})
			}
			return l
		}},
		"/api/v1/nodes": {n: pages, page: func(from, to int) runtime.Object {
			l := &metav1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "PartialObjectMetadataList"}}
			for i := from; i < to; i++ {
				l.Items = append(l.Items, metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%d", i)}})
			}
			return l
		}},
	})
	c, err := newReadClientForConfig(srv.config())
	if err != nil {
		t.Fatal(err)
	}
	p := newProgress(nil, time.Hour)
	defer p.stop()
	ctx := context.Background()
	start := time.Now()
	var claims []*deviceusage.Claim
	if _, err := listKept(ctx, p, "ResourceClaims", metav1.ListOptions{Limit: 1}, c.dra.ResourceClaims("").List, &claims, deviceusage.ClaimOf); err != nil {
		t.Fatal(err)
	}
	var nodes []*corev1.Node
	if _, err := listKept(ctx, p, "Nodes", metav1.ListOptions{Limit: 1}, c.meta.Resource(corev1.SchemeGroupVersion.WithResource("nodes")).List, &nodes, keptNode); err != nil {
		t.Fatal(err)
	}
	if len(claims) != pages || len(nodes) != pages {
		t.Fatalf("%d claims and %d nodes listed, want %d each", len(claims), len(nodes), pages)
	}
	// Unthrottled, the 60 requests take milliseconds; throttled, 8 s.
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("%d pages of claims and %d of nodes took %s: the client holds its requests back", pages, pages, d.Round(time.Millisecond))
	}
}

// TestOneShotGC: status and why collect garbage at oneShotGCPercent, unless GOGC says otherwise.
func TestOneShotGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	t.Setenv("GOGC", "")
	if err := os.Unsetenv("GOGC"); err != nil {
		t.Fatal(err)
	}
	oneShotGC()
	if got := debug.SetGCPercent(100); got != oneShotGCPercent {
		t.Errorf("GOGC unset: collecting at %d %%, want %d", got, oneShotGCPercent)
	}
	t.Setenv("GOGC", "100")
	oneShotGC()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GOGC=100: collecting at %d %%, want GOGC's", got)
	}
}
