package podinject

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// fakeSchedulingAPI serves discovery of scheduling.k8s.io/v1beta1 (when served) and PodGroups by
// name, counting the requests per path.
type fakeSchedulingAPI struct {
	served bool
	groups map[string]string // name -> spec JSON

	mu       sync.Mutex
	requests map[string]int
}

func (f *fakeSchedulingAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests[r.URL.Path]++
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	notFound := func() {
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound})
	}
	const prefix = "/apis/scheduling.k8s.io/v1beta1"
	switch {
	case !f.served || !strings.HasPrefix(r.URL.Path, prefix):
		notFound()
	case r.URL.Path == prefix:
		_ = json.NewEncoder(w).Encode(metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"}, GroupVersion: "scheduling.k8s.io/v1beta1",
			APIResources: []metav1.APIResource{{Name: "podgroups", Namespaced: true, Kind: "PodGroup"}}})
	default:
		name := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
		spec, ok := f.groups[name]
		if !ok {
			notFound()
			return
		}
		_, _ = w.Write([]byte(`{"apiVersion":"scheduling.k8s.io/v1beta1","kind":"PodGroup","metadata":{"name":"` + name + `"},"spec":` + spec + `}`))
	}
}

func (f *fakeSchedulingAPI) count(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests[path]
}

// TestPodGroupClientCost: a burst of pods of one group costs one read of it and one discovery;
// a group that does not exist is read again (it may be created any moment); where PodGroups are
// not served nothing but discovery is asked, once per servedTTL.
func TestPodGroupClientCost(t *testing.T) {
	api := &fakeSchedulingAPI{served: true, requests: map[string]int{},
		groups: map[string]string{"team": `{"resourceClaims":[{"name":"gpu-dra","resourceClaimTemplateName":"one-gpu"},{"name":"bad"}]}`}}
	c := newTestPodGroupClient(t, api)
	ctx := context.Background()
	for range 20 {
		g, err := c.SharedClaims(ctx, "ns", "team")
		if err != nil {
			t.Fatal(err)
		}
		if !g.Served || !g.Found || len(g.Claims) != 1 || g.Claims[0].Name != ClaimName || *g.Claims[0].ResourceClaimTemplateName != "one-gpu" {
			t.Fatalf("SharedClaims = %+v; want the one entry a pod can match", g)
		}
	}
	if n := api.count("/apis/scheduling.k8s.io/v1beta1/namespaces/ns/podgroups/team"); n != 1 {
		t.Errorf("20 pods of one group read it %d times, want once", n)
	}
	if n := api.count("/apis/scheduling.k8s.io/v1beta1"); n != 1 {
		t.Errorf("discovery asked %d times, want once", n)
	}
	for range 2 {
		if g, err := c.SharedClaims(ctx, "ns", "later"); err != nil || !g.Served || g.Found {
			t.Fatalf("missing group: %+v, %v", g, err)
		}
	}
	if n := api.count("/apis/scheduling.k8s.io/v1beta1/namespaces/ns/podgroups/later"); n != 2 {
		t.Errorf("a missing group was read %d times for two pods, want each time", n)
	}

	none := &fakeSchedulingAPI{requests: map[string]int{}}
	c = newTestPodGroupClient(t, none)
	for range 5 {
		if g, err := c.SharedClaims(ctx, "ns", "team"); err != nil || g.Served {
			t.Fatalf("not served: %+v, %v", g, err)
		}
	}
	none.mu.Lock()
	defer none.mu.Unlock()
	for path, n := range none.requests {
		if strings.Contains(path, "podgroups") || n != 1 {
			t.Errorf("without PodGroups %s was asked %d times; want discovery only, once", path, n)
		}
	}
}

func newTestPodGroupClient(t *testing.T, api http.Handler) *PodGroupClient {
	t.Helper()
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return NewPodGroupClient(cs.Discovery())
}
