// Package podresources reads from the kubelet's PodResources API which containers use which
// devices of this driver's claims: the link between a GPU and the workload holding it, which no
// ResourceClaim records (a claim names pods, never containers).
package podresources

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

const (
	// DefaultSocket is where the kubelet serves the API (under its root directory).
	DefaultSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

	// maxMessageBytes bounds one List answer: a node runs at most a few hundred pods, each a few
	// hundred bytes here; the kubelet's own limit is 16 MiB.
	maxMessageBytes = 16 << 20
	// maxConsumers bounds what one List may add, whatever the kubelet answers.
	maxConsumers = 16384
)

// Consumer is one container using one device of a claim.
type Consumer struct {
	Namespace, Pod, Container string
	// ClaimNamespace and ClaimName name the claim; Pool and Device the device, ShareID the share of
	// it where the device is shared (empty otherwise, and on kubelets before 1.36).
	ClaimNamespace, ClaimName string
	Pool, Device, ShareID     string
}

// Lister lists the consumers of this driver's devices on the node.
type Lister interface {
	Consumers(ctx context.Context) ([]Consumer, error)
}

// Client asks the kubelet, at most once per cache period, each call bounded by a timeout.
type Client struct {
	driver  string
	conn    *grpc.ClientConn
	client  podresourcesapi.PodResourcesListerClient
	timeout time.Duration
	ttl     time.Duration
	now     func() time.Time

	mu      sync.Mutex
	fetched time.Time
	last    []Consumer
	lastErr error
}

// Option configures a Client.
type Option func(*Client)

// WithTimeout bounds each List call (default 2 s).
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithCachePeriod is how long one answer serves (default 10 s): every scrape of every Prometheus
// replica would otherwise be a List of every pod on the node.
func WithCachePeriod(d time.Duration) Option { return func(c *Client) { c.ttl = d } }

// New connects lazily to the socket; nothing is sent until Consumers is called.
func New(driver, socket string, opts ...Option) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageBytes)))
	if err != nil {
		return nil, fmt.Errorf("pod resources socket %s: %w", socket, err)
	}
	c := &Client{driver: driver, conn: conn, client: podresourcesapi.NewPodResourcesListerClient(conn),
		timeout: 2 * time.Second, ttl: 10 * time.Second, now: time.Now}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Consumers returns the containers using this driver's devices, from an answer at most one cache
// period old. An error is remembered for the period too: a kubelet without the API (or with the
// DRA part of it off) is not asked on every scrape.
func (c *Client) Consumers(ctx context.Context) ([]Consumer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.fetched.IsZero() && c.now().Sub(c.fetched) < c.ttl {
		return c.last, c.lastErr
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	c.fetched = c.now()
	if err != nil {
		c.last, c.lastErr = nil, fmt.Errorf("list pod resources: %w", err)
		return nil, c.lastErr
	}
	c.last, c.lastErr = consumersOf(c.driver, resp.GetPodResources()), nil
	return c.last, nil
}

// consumersOf keeps the containers' devices of driver's claims. Kubelets before 1.31 name no
// driver or device: then every device of the claim is the container's (Device empty).
func consumersOf(driver string, pods []*podresourcesapi.PodResources) []Consumer {
	var out []Consumer
	for _, p := range pods {
		for _, ctr := range p.GetContainers() {
			for _, dr := range ctr.GetDynamicResources() {
				for _, cr := range dr.GetClaimResources() {
					if cr.GetDriverName() != "" && cr.GetDriverName() != driver {
						continue
					}
					if len(out) == maxConsumers {
						return out
					}
					out = append(out, Consumer{
						Namespace: p.GetNamespace(), Pod: p.GetName(), Container: ctr.GetName(),
						ClaimNamespace: dr.GetClaimNamespace(), ClaimName: dr.GetClaimName(),
						Pool: cr.GetPoolName(), Device: cr.GetDeviceName(), ShareID: cr.GetShareId(),
					})
				}
			}
		}
	}
	return out
}
