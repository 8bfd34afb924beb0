package inventory

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// claimWrites are the writes to a claim the claims informer must tell apart: what it keeps of
// the claim (allocation, consumers) changed or not.
type claimWrites interface {
	Update(ctx context.Context, c *resourceapi.ResourceClaim, o metav1.UpdateOptions) (*resourceapi.ResourceClaim, error)
	UpdateStatus(ctx context.Context, c *resourceapi.ResourceClaim, o metav1.UpdateOptions) (*resourceapi.ResourceClaim, error)
	Get(ctx context.Context, name string, o metav1.GetOptions) (*resourceapi.ResourceClaim, error)
}

func gpuClaim(name string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.example.com", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}}}}
}

func allocate(c *resourceapi.ResourceClaim, device string) {
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "gpu", Driver: "gpu.example.com", Pool: "node-0", Device: device}}}}
}

// changesCounter counts the informer's change signals.
type changesCounter struct{ n atomic.Int64 }

func (c *changesCounter) inc() { c.n.Add(1) }

// waitFor waits until at least want changes were signalled, and fails the test after a minute.
func (c *changesCounter) waitFor(t *testing.T, want int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for c.n.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d changes signalled after a minute, want %d", c.n.Load(), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writesKeptOrNot writes status.devices of allocated, then a label on it, then allocates marker:
// only the last changes what the informer keeps. The informer hands events over in order, so
// once the marker's change is signalled the two writes before it have been seen.
func writesKeptOrNot(ctx context.Context, t *testing.T, claims claimWrites, changes *changesCounter, allocated, marker string) {
	t.Helper()
	before := changes.n.Load()
	c, err := claims.Get(ctx, allocated, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rv := c.ResourceVersion
	c.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: "gpu.example.com", Pool: "node-0", Device: "gpu-0", Conditions: []metav1.Condition{
		{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Prepared", LastTransitionTime: metav1.Now()}}}}
	if c, err = claims.UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if len(c.Status.Devices) == 0 || c.ResourceVersion == rv {
		t.Fatalf("status.devices not written (resourceVersion %s, was %s)", c.ResourceVersion, rv)
	}
	c.Labels = map[string]string{"team": "a"}
	if _, err = claims.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	m, err := claims.Get(ctx, marker, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	allocate(m, "gpu-1")
	if _, err = claims.UpdateStatus(ctx, m, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	changes.waitFor(t, before+1)
	if got := changes.n.Load() - before; got != 1 {
		t.Errorf("%d changes signalled; want 1, for the allocation alone (status.devices and labels are not kept)", got)
	}
}

func startClaims(t *testing.T, cs kubernetes.Interface, changes *changesCounter) *Claims {
	t.Helper()
	c := NewClaims(cs, 0, changes.inc)
	c.Start(t.Context())
	deadline := time.Now().Add(time.Minute)
	for !c.HasSynced() {
		if time.Now().After(deadline) {
			t.Fatal("claims not synced after a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c
}

// TestClaimsChangeOnlyWhatIsKept: with a fake clientset, a write of status.devices or of labels
// (each with a new resourceVersion) signals no change; an allocation does.
func TestClaimsChangeOnlyWhatIsKept(t *testing.T) {
	allocated, marker := gpuClaim("allocated"), gpuClaim("marker")
	allocate(allocated, "gpu-0")
	allocated.ResourceVersion = "1"
	cs := fake.NewClientset(allocated, marker)
	claims := cs.ResourceV1().ResourceClaims("default")
	changes := &changesCounter{}
	startClaims(t, cs, changes)
	changes.waitFor(t, 2)
	// The fake tracker keeps the resourceVersion it is given: move it on as an API server does.
	writesKeptOrNot(t.Context(), t, versioned{claims, &atomic.Int64{}}, changes, "allocated", "marker")
}

// versioned gives each write a new resourceVersion.
type versioned struct {
	claimWrites
	rv *atomic.Int64
}

func (v versioned) Update(ctx context.Context, c *resourceapi.ResourceClaim, o metav1.UpdateOptions) (*resourceapi.ResourceClaim, error) {
	c.ResourceVersion = fmt.Sprint(100 + v.rv.Add(1))
	return v.claimWrites.Update(ctx, c, o)
}

func (v versioned) UpdateStatus(ctx context.Context, c *resourceapi.ResourceClaim, o metav1.UpdateOptions) (*resourceapi.ResourceClaim, error) {
	c.ResourceVersion = fmt.Sprint(100 + v.rv.Add(1))
	return v.claimWrites.UpdateStatus(ctx, c, o)
}

// listRequests records the query of every list of ResourceClaims sent.
type listRequests struct {
	mu      sync.Mutex
	queries []string
	next    http.RoundTripper
}

func (l *listRequests) RoundTrip(r *http.Request) (*http.Response, error) {
	q := r.URL.Query()
	if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/resourceclaims") && q.Get("watch") != "true" {
		l.mu.Lock()
		l.queries = append(l.queries, r.URL.RawQuery)
		l.mu.Unlock()
	}
	return l.next.RoundTrip(r)
}

// TestClaimsAPIServer: against a real API server, with more claims than a page holds, the claims
// informer lists them in pages of claimsPageSize and caches every one; then a write of
// status.devices or labels signals no change, an allocation does.
func TestClaimsAPIServer(t *testing.T) {
	srv := testapiserver.Start(t)
	ctx := t.Context()
	const n = 2*claimsPageSize + 50
	claims := srv.Clientset.ResourceV1().ResourceClaims("default")
	createClaims(ctx, t, claims, n)
	allocated, err := claims.Get(ctx, "claim-0000", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	allocate(allocated, "gpu-0")
	if _, err := claims.UpdateStatus(ctx, allocated, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	lists := &listRequests{}
	cfg := *srv.Config
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { lists.next = rt; return lists })
	cs := kubernetes.NewForConfigOrDie(&cfg)
	changes := &changesCounter{}
	c := startClaims(t, cs, changes)
	cached, err := c.Claims()
	if err != nil {
		t.Fatal(err)
	}
	if len(cached) != n {
		t.Fatalf("%d claims cached, want %d", len(cached), n)
	}
	lists.mu.Lock()
	queries := lists.queries
	lists.mu.Unlock()
	if len(queries) < n/claimsPageSize+1 {
		t.Errorf("%d lists of ResourceClaims for %d claims, want pages of %d: %q", len(queries), n, claimsPageSize, queries)
	}
	for _, q := range queries {
		// At resourceVersion "0" the API server serves the whole list from its cache, limit or not.
		if !strings.Contains(q, fmt.Sprintf("limit=%d", claimsPageSize)) || strings.Contains(q, "resourceVersion=0") {
			t.Errorf("list %q: want limit=%d, not at resourceVersion 0", q, claimsPageSize)
		}
	}
	changes.waitFor(t, n)
	writesKeptOrNot(ctx, t, claims, changes, "claim-0000", "claim-0001")
}

// createClaims creates n pending claims, claim-0000 onwards.
func createClaims(ctx context.Context, t *testing.T, claims claimCreator, n int) {
	t.Helper()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range n {
		g.Go(func() error {
			_, err := claims.Create(gctx, gpuClaim(fmt.Sprintf("claim-%04d", i)), metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

type claimCreator interface {
	Create(ctx context.Context, c *resourceapi.ResourceClaim, o metav1.CreateOptions) (*resourceapi.ResourceClaim, error)
}
