package app

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sync/errgroup"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	draclient "k8s.io/dynamic-resource-allocation/client"

	"github.com/gpu-dra/gpu-dra/hack/buildenv"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// pagedObjects is how many ResourceSlices and ResourceClaims TestListPagesAgainstCluster creates:
// two pages of slices, one of claims.
const pagedObjects = 1201

// requestLog records the list requests a client sends, per resource.
type requestLog struct {
	mu    sync.Mutex
	lists map[string][]string // resource: raw queries
}

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(r)
		// Lists the server answers: the converting client's probes for the served version get 404.
		if r.Method == http.MethodGet && err == nil && resp.StatusCode == http.StatusOK {
			parts := strings.Split(r.URL.Path, "/")
			l.mu.Lock()
			l.lists[parts[len(parts)-1]] = append(l.lists[parts[len(parts)-1]], r.URL.RawQuery)
			l.mu.Unlock()
		}
		return resp, err
	})
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestListPagesAgainstCluster: status reads the 1,201 ResourceSlices and 1,201 ResourceClaims of a
// real API server in pages of 1,000 slices and 5,000 claims, with no resourceVersion; 1.34 serves
// every page from its watch cache (its cache list counter says so). 1.37.2 served them from etcd here
// (its consistent-read check delegated the lists), which the pages bound just as well.
func TestListPagesAgainstCluster(t *testing.T) {
	for _, rel := range []struct {
		release, runtimeConfig, featureGates string
		fromCache                            bool
	}{
		{buildenv.Oldest, testapiserver.Oldest, "DynamicResourceAllocation=true", false},
		{buildenv.Seed, testapiserver.AllVersions, "", true},
		{buildenv.Newest, testapiserver.AllVersions, "", false},
	} {
		t.Run(rel.release, func(t *testing.T) {
			dir := testapiserver.ReleaseAssetsDir(t, rel.release)
			srv := testapiserver.Start(t, testapiserver.WithAssetsDir(dir),
				testapiserver.WithRuntimeConfig(rel.runtimeConfig), testapiserver.WithFeatureGates(rel.featureGates))
			createPaged(t, srv)
			cachedBefore := cacheLists(t, srv)
			log := &requestLog{lists: map[string][]string{}}
			cfg := rest.CopyConfig(srv.Config)
			cfg.Wrap(log.wrap)
			c, err := newReadClientForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			var errOut bytes.Buffer
			state, _, err := c.list(context.Background(), listOptions{claims: true}, &errOut)
			if err != nil {
				t.Fatal(err)
			}
			if len(state.Slices) != pagedObjects || len(state.Kept) != pagedObjects {
				t.Errorf("read %d slices and %d claims, want %d of each", len(state.Slices), len(state.Kept), pagedObjects)
			}
			for _, want := range []struct {
				resource string
				limit    int
				pages    int
			}{{"resourceslices", 1000, 2}, {"resourceclaims", 5000, 1}} {
				queries := log.lists[want.resource]
				if len(queries) != want.pages {
					t.Errorf("%s: %d list requests %q, want %d pages", want.resource, len(queries), queries, want.pages)
				}
				limit := fmt.Sprintf("limit=%d", want.limit)
				for i, q := range queries {
					if !strings.Contains(q, limit) || strings.Contains(q, "resourceVersion=") || (i > 0) != strings.Contains(q, "continue=") {
						t.Errorf("%s request %d: query %q, want %s, no resourceVersion, continue from the second page on", want.resource, i, q, limit)
					}
				}
			}
			if !rel.fromCache {
				return
			}
			cached := cacheLists(t, srv)
			for _, resource := range []string{"resourceslices", "resourceclaims"} {
				if n := cached[resource] - cachedBefore[resource]; n < float64(len(log.lists[resource])) {
					t.Errorf("%s: %g lists served from the watch cache, want its %d pages", resource, n, len(log.lists[resource]))
				}
			}
		})
	}
}

// createPaged creates pagedObjects slices (one GPU each) and claims, 16 at a time.
func createPaged(t *testing.T, srv *testapiserver.Server) {
	t.Helper()
	dra := draclient.New(srv.Clientset)
	g, ctx := errgroup.WithContext(context.Background())
	g.SetLimit(16)
	for i := range pagedObjects {
		g.Go(func() error {
			node := fmt.Sprintf("node-%04d", i)
			s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node},
				Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.example.com", NodeName: &node,
					Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}, Devices: []resourceapi.Device{{Name: "gpu-0"}}}}
			if _, err := dra.ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
				return err
			}
			c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("claim-%04d", i)},
				Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
					Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.example.com"}}}}}}
			_, err := dra.ResourceClaims("default").Create(ctx, c, metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

// cacheLists reads the server's apiserver_cache_list_total: the lists it served from its watch
// cache, per resource.
func cacheLists(t *testing.T, srv *testapiserver.Server) map[string]float64 {
	t.Helper()
	body, err := srv.Clientset.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_cache_list_total{") {
			continue
		}
		labels, value, _ := strings.Cut(line[strings.Index(line, "{")+1:], "} ")
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		for _, r := range []string{"resourceslices", "resourceclaims"} {
			if strings.Contains(labels, r) {
				out[r] += v
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
