// Package liveness probes the plugin's two gRPC sockets the way the kubelet uses them and serves the
// result as an HTTP liveness endpoint. A process whose sockets were removed or whose gRPC servers hang
// is not alive even if its HTTP server still answers.
package liveness

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// dial opens a gRPC client connection on a Unix socket. grpc.NewClient connects lazily; the first
// call fails if nobody listens.
func dial(socketPath string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix://"+socketPath, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", socketPath, err)
	}
	return conn, nil
}

// ProbeRegistration calls GetInfo on a registration socket, as the kubelet's plugin watcher does,
// and checks that it names the driver.
func ProbeRegistration(ctx context.Context, socketPath, driverName string) error {
	conn, err := dial(socketPath)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return fmt.Errorf("GetInfo on registration socket %s: %w", socketPath, err)
	}
	if info.Name != driverName || info.Type != registerapi.DRAPlugin {
		return fmt.Errorf("registration socket %s answers for %s plugin %q, want DRAPlugin %q", socketPath, info.Type, info.Name, driverName)
	}
	return nil
}

// ProbeDRA calls NodePrepareResources with no claims on a DRA socket: it goes through the same
// server, interceptors and serialization lock as a real prepare but changes nothing. The v1 service
// is tried first, then v1beta1, like a kubelet of either generation.
func ProbeDRA(ctx context.Context, socketPath string) error {
	conn, err := dial(socketPath)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	_, err = drapbv1.NewDRAPluginClient(conn).NodePrepareResources(ctx, &drapbv1.NodePrepareResourcesRequest{})
	if status.Code(err) == codes.Unimplemented {
		_, err = drapbv1beta1.NewDRAPluginClient(conn).NodePrepareResources(ctx, &drapbv1beta1.NodePrepareResourcesRequest{})
	}
	if err != nil {
		return fmt.Errorf("NodePrepareResources on DRA socket %s: %w", socketPath, err)
	}
	return nil
}

// Checker is the liveness of one plugin instance.
type Checker struct {
	DriverName         string
	RegistrationSocket string
	DRASocket          string
	// Timeout bounds each probe; a serialized prepare that holds the lock longer makes the probe
	// fail, which is right: a plugin stuck that long is not serving the kubelet either.
	Timeout time.Duration
}

// Check probes both sockets.
func (c *Checker) Check(ctx context.Context) error {
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return errors.Join(ProbeRegistration(ctx, c.RegistrationSocket, c.DriverName), ProbeDRA(ctx, c.DRASocket))
}

// Healthz adapts Check to controller-runtime's healthz.Checker.
func (c *Checker) Healthz(req *http.Request) error {
	if err := c.Check(req.Context()); err != nil {
		klog.FromContext(req.Context()).V(2).Info("Liveness probe failed", "err", err)
		return err
	}
	return nil
}
