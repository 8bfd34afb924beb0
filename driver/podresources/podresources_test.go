package podresources

import (
	"context"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"k8s.io/utils/ptr"

	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// kubelet serves the PodResources API on a unix socket, as the kubelet does.
type kubelet struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	pods  []*podresourcesapi.PodResources
	calls atomic.Int32
	block chan struct{}
}

func (k *kubelet) List(ctx context.Context, _ *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	k.calls.Add(1)
	if k.block != nil {
		select {
		case <-k.block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &podresourcesapi.ListPodResourcesResponse{PodResources: k.pods}, nil
}

func serve(t *testing.T, k *kubelet) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, k)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return socket
}

func dynamic(claim string, res ...*podresourcesapi.ClaimResource) *podresourcesapi.DynamicResource {
	return &podresourcesapi.DynamicResource{ClaimName: claim, ClaimNamespace: "ns", ClaimResources: res}
}

func TestConsumers(t *testing.T) {
	k := &kubelet{pods: []*podresourcesapi.PodResources{
		{Name: "train", Namespace: "ns", Containers: []*podresourcesapi.ContainerResources{
			{Name: "main", DynamicResources: []*podresourcesapi.DynamicResource{
				dynamic("gpus",
					&podresourcesapi.ClaimResource{DriverName: "gpu.example.com", PoolName: "node-1", DeviceName: "gpu-0"},
					&podresourcesapi.ClaimResource{DriverName: "nic.example.com", PoolName: "node-1", DeviceName: "nic-0"}),
			}},
			{Name: "no-claims"},
		}},
		{Name: "web", Namespace: "ns", Containers: []*podresourcesapi.ContainerResources{
			{Name: "srv", DynamicResources: []*podresourcesapi.DynamicResource{
				dynamic("shared", &podresourcesapi.ClaimResource{DriverName: "gpu.example.com", PoolName: "node-1", DeviceName: "gpu-1", ShareId: ptr.To("abc")}),
			}},
		}},
	}}
	now := time.Unix(1000, 0)
	c, err := New("gpu.example.com", serve(t, k), WithCachePeriod(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	c.now = func() time.Time { return now }

	got, err := c.Consumers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []Consumer{
		{Namespace: "ns", Pod: "train", Container: "main", ClaimNamespace: "ns", ClaimName: "gpus", Pool: "node-1", Device: "gpu-0"},
		{Namespace: "ns", Pod: "web", Container: "srv", ClaimNamespace: "ns", ClaimName: "shared", Pool: "node-1", Device: "gpu-1", ShareID: "abc"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("consumers (-want +got):\n%s", d)
	}

	// Within the cache period the kubelet is not asked again; after it, it is.
	now = now.Add(9 * time.Second)
	if _, err := c.Consumers(context.Background()); err != nil || k.calls.Load() != 1 {
		t.Errorf("within the period: err %v, calls %d, want 1", err, k.calls.Load())
	}
	now = now.Add(2 * time.Second)
	if _, err := c.Consumers(context.Background()); err != nil || k.calls.Load() != 2 {
		t.Errorf("after the period: err %v, calls %d, want 2", err, k.calls.Load())
	}
}

// TestConsumersBounded: a kubelet that does not answer costs a scrape the timeout, and its error
// is remembered for the cache period.
func TestConsumersBounded(t *testing.T) {
	k := &kubelet{block: make(chan struct{})}
	defer close(k.block)
	c, err := New("gpu.example.com", serve(t, k), WithTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Consumers(context.Background()); err == nil {
		t.Fatal("no error from a kubelet that never answers")
	}
	if _, err := c.Consumers(context.Background()); err == nil || k.calls.Load() != 1 {
		t.Errorf("second call: err %v, calls %d: want the remembered error and 1 call", err, k.calls.Load())
	}
}

// TestConsumersCapped: whatever the kubelet answers, at most maxConsumers are kept.
func TestConsumersCapped(t *testing.T) {
	res := make([]*podresourcesapi.ClaimResource, maxConsumers+10)
	for i := range res {
		res[i] = &podresourcesapi.ClaimResource{DriverName: "gpu.example.com", DeviceName: "gpu-0"}
	}
	pods := []*podresourcesapi.PodResources{{Name: "p", Namespace: "ns", Containers: []*podresourcesapi.ContainerResources{
		{Name: "c", DynamicResources: []*podresourcesapi.DynamicResource{dynamic("c", res...)}}}}}
	if n := len(consumersOf("gpu.example.com", pods)); n != maxConsumers {
		t.Errorf("kept %d consumers, want %d", n, maxConsumers)
	}
}

// TestMissingSocket: the connection is lazy; a missing socket is an error of the call, not of New.
func TestMissingSocket(t *testing.T) {
	c, err := New("gpu.example.com", filepath.Join(t.TempDir(), "none.sock"), WithTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Consumers(context.Background()); err == nil {
		t.Error("no error for a missing socket")
	}
}
