package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"k8s.io/klog/v2"
)

// DefaultShutdownDelay is the chart's: kube-proxy applies an endpoint change within about a second
// of the EndpointSlice controller writing it (its minSyncPeriod); ten seconds leave room for a
// busy controller, API server and node.
const DefaultShutdownDelay = 10 * time.Second

// maxShutdownDelay: a replica that waits longer only holds a rollout up.
const maxShutdownDelay = 5 * time.Minute

// Run starts r and serves until ctx ends. Then it reports not ready and keeps serving, informers
// and all, for o.ShutdownDelay before r stops. A terminating replica leaves the
// Service's endpoints only once the EndpointSlice controller and then kube-proxy on the API
// server's node have caught up; until then the API server still dials this pod's address. A
// server that closed its listener at the signal refused those calls, and once the pod's network
// was gone they hung until the webhook's timeout: a planned rollout failed pod creations. After the
// delay the server shuts down gracefully: requests in flight are answered and kept-alive
// connections closed. During the delay every answer closes its connection (webhookServer.drain),
// so by then the API server has no connection left here to lose a review on, and its next one goes
// to a replica that stays.
func Run(ctx context.Context, r *Runner, o *Options) error {
	if err := r.AddReadyzCheck("shutdown", func(*http.Request) error {
		if r.webhook.draining.Load() {
			return errors.New("shutting down: serving until the endpoints drop this replica")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("add readyz: %w", err)
	}
	serve := afterDelay(ctx, o.ShutdownDelay, func() {
		r.webhook.drain()
		klog.FromContext(ctx).Info("Shutdown requested: not ready, still serving", "shutdownDelay", o.ShutdownDelay)
	})
	return r.Start(serve)
}

// afterDelay returns a context that ends delay after ctx does, keeping ctx's values; onDone runs
// when ctx ends.
func afterDelay(ctx context.Context, delay time.Duration, onDone func()) context.Context {
	serve, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		<-ctx.Done()
		onDone()
		timer := time.NewTimer(delay)
		defer timer.Stop()
		<-timer.C
		cancel()
	}()
	return serve
}
