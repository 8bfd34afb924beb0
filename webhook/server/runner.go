package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/gpu-dra/gpu-dra/certs"
)

// Runnable is a part of the webhook that runs until its context ends.
type Runnable interface {
	Start(ctx context.Context) error
}

// RunnableFunc is a function as a Runnable.
type RunnableFunc func(ctx context.Context) error

// Start calls f.
func (f RunnableFunc) Start(ctx context.Context) error { return f(ctx) }

// shutdownGrace bounds how long the parts take to stop once the serving context ends, as
// controller-runtime's manager bounds it by default.
const shutdownGrace = 30 * time.Second

// Runner runs the webhook's servers (webhooks, probes, metrics) and the informers behind them,
// in the order controller-runtime's manager does, with controller-runtime's webhook server,
// probe handlers and metrics server. It is not the manager: nothing here reads through a
// manager's client or cache, and linking the manager links net/http/pprof, whose reference to
// the heap profile keeps the runtime's memory profiler on in every process that links it (a
// sampled stack for every 512 KiB allocated, and the tables they go into: 1.5 MiB of an idle
// webhook's resident memory).
type Runner struct {
	config  *rest.Config
	webhook *webhookServer
	metrics metricsserver.Server
	probes  net.Listener
	healthz map[string]healthz.Checker
	readyz  map[string]healthz.Checker
	// others start after the servers and stop before them.
	others []Runnable
}

// NewRunner creates the runner with the webhook server, probes and metrics configured from o.
// The webhook server watches CertDir and serves renewed certificates without a restart, and
// bounds every connection by o.Timeouts. The probe port is bound here, so that a port in use is
// an error before anything starts; the metrics server binds its own when it starts.
func NewRunner(cfg *rest.Config, o *Options) (*Runner, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	r := &Runner{
		config: cfg,
		webhook: newWebhookServer(webhook.Options{
			Host:     o.Host,
			Port:     o.Port,
			CertDir:  o.CertDir,
			CertName: o.CertName,
			KeyName:  o.KeyName,
			TLSOpts:  certs.TLSOpts(),
		}, o.Timeouts, limits{requests: o.MaxRequestsInFlight, connections: o.maxConnections(), handshakes: o.MaxHandshakesPerSecond}),
		healthz: map[string]healthz.Checker{},
		readyz:  map[string]healthz.Checker{},
	}
	metrics, err := metricsserver.NewServer(metricsserver.Options{BindAddress: o.MetricsBindAddress}, cfg, nil)
	if err != nil {
		return nil, fmt.Errorf("--metrics-bind-address=%s: %w", o.MetricsBindAddress, err)
	}
	if metrics != nil { // nil: --metrics-bind-address=0
		r.metrics = metrics
		// What the manager's controller package registers, which dashboards of the process read.
		if err := register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
			return nil, fmt.Errorf("register process metrics: %w", err)
		}
		if err := register(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsAll))); err != nil {
			return nil, fmt.Errorf("register Go runtime metrics: %w", err)
		}
	}
	if o.HealthProbeBindAddress != "" && o.HealthProbeBindAddress != "0" {
		if r.probes, err = net.Listen("tcp", o.HealthProbeBindAddress); err != nil {
			return nil, fmt.Errorf("--health-probe-bind-address=%s: %w", o.HealthProbeBindAddress, err)
		}
	}
	return r, nil
}

// GetConfig is the API server the webhook reads.
func (r *Runner) GetConfig() *rest.Config { return r.config }

// GetWebhookServer is where the admission handlers are registered.
func (r *Runner) GetWebhookServer() webhook.Server { return r.webhook }

// Add runs x beside the servers once Start is called.
func (r *Runner) Add(x Runnable) { r.others = append(r.others, x) }

// AddHealthzCheck serves check under /healthz.
func (r *Runner) AddHealthzCheck(name string, check healthz.Checker) error {
	return addCheck(r.healthz, "healthz", name, check)
}

// AddReadyzCheck serves check under /readyz.
func (r *Runner) AddReadyzCheck(name string, check healthz.Checker) error {
	return addCheck(r.readyz, "readyz", name, check)
}

func addCheck(checks map[string]healthz.Checker, endpoint, name string, check healthz.Checker) error {
	if _, ok := checks[name]; ok {
		return fmt.Errorf("%s check %q added twice", endpoint, name)
	}
	checks[name] = check
	return nil
}

// Start runs every part until ctx ends or one fails, then stops them: the informers and the
// rest first, then the webhook server, then the probes and metrics, each group within what is
// left of shutdownGrace. It returns the first part's error.
func (r *Runner) Start(ctx context.Context) error {
	var servers []Runnable
	if r.metrics != nil {
		servers = append(servers, r.metrics)
	}
	if r.probes != nil {
		servers = append(servers, &httpServer{name: "health probes", listener: r.probes, handler: r.probeMux()})
	}
	groups := [][]Runnable{servers, {r.webhook}, r.others}
	failed := make(chan error, len(servers)+1+len(r.others))
	running := make([]*group, len(groups))
	for i, parts := range groups {
		running[i] = startGroup(ctx, parts, failed)
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-failed:
	}
	grace, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	for i := len(running) - 1; i >= 0; i-- {
		if !running[i].stop(grace) {
			return errors.Join(err, fmt.Errorf("parts still running %s after the webhook was stopped", shutdownGrace))
		}
	}
	return err
}

// register serves c on the metrics endpoint (controller-runtime's registry), in place of an
// equal collector registered earlier in the same process (tests run several webhooks).
func register(c prometheus.Collector) error {
	err := ctrlmetrics.Registry.Register(c)
	var already prometheus.AlreadyRegisteredError
	if errors.As(err, &already) {
		ctrlmetrics.Registry.Unregister(already.ExistingCollector)
		err = ctrlmetrics.Registry.Register(c)
	}
	return err
}

// probeMux serves /healthz and /readyz, and each check alone under them (/readyz/inventory).
func (r *Runner) probeMux() *http.ServeMux {
	mux := http.NewServeMux()
	for path, checks := range map[string]map[string]healthz.Checker{"/healthz": r.healthz, "/readyz": r.readyz} {
		h := http.StripPrefix(path, &healthz.Handler{Checks: checks})
		mux.Handle(path, h)
		mux.Handle(path+"/", h)
	}
	return mux
}

// group is parts started together and stopped together.
type group struct {
	cancel context.CancelFunc
	done   sync.WaitGroup
}

// startGroup starts parts under a context of their own that keeps ctx's values; a part's error
// goes to failed (a part that returns nil early has simply finished).
func startGroup(ctx context.Context, parts []Runnable, failed chan<- error) *group {
	g := &group{}
	var partCtx context.Context
	partCtx, g.cancel = context.WithCancel(context.WithoutCancel(ctx))
	for _, p := range parts {
		g.done.Go(func() {
			if err := p.Start(partCtx); err != nil {
				failed <- err
			}
		})
	}
	return g
}

// stop ends the group's context and waits for its parts until grace ends; false if they did not
// all return by then.
func (g *group) stop(grace context.Context) bool {
	g.cancel()
	done := make(chan struct{})
	go func() {
		g.done.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-grace.Done():
		return false
	}
}

// httpServer serves handler on listener until its context ends, then shuts down gracefully.
type httpServer struct {
	name     string
	listener net.Listener
	handler  http.Handler
}

func (s *httpServer) Start(ctx context.Context) error {
	// The webhook port's bounds on headers and idle connections: probes and scrapes are small.
	t := DefaultTimeouts()
	srv := &http.Server{
		Handler:           s.handler,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ReadHeaderTimeout: t.ReadHeader,
		IdleTimeout:       t.Idle,
		MaxHeaderBytes:    t.MaxHeaderBytes,
	}
	klog.FromContext(ctx).Info("Serving", "server", s.name, "address", s.listener.Addr().String())
	return serveUntilDone(ctx, srv, s.listener, s.name)
}

// serveUntilDone serves srv on l until ctx ends, then shuts it down gracefully: requests in
// flight are answered, idle connections closed.
func serveUntilDone(ctx context.Context, srv *http.Server, l net.Listener, name string) error {
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := srv.Shutdown(shutdownCtx); err != nil {
			klog.FromContext(ctx).Error(err, "Shutting down", "server", name)
		}
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("%s: %w", name, err)
	}
	<-stopped
	return nil
}
