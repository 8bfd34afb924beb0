package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/net/netutil"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// Timeouts bound what one connection to the webhook port may hold. Any pod in the cluster can
// reach the Service, not only the API server, and controller-runtime's webhook server (which
// webhook.Options cannot configure) waits 32 s for headers and forever for a body.
type Timeouts struct {
	// ReadHeader bounds the TLS handshake and a request's headers; the API server sends both at once.
	ReadHeader time.Duration
	// Read bounds a whole request, body included.
	Read time.Duration
	// Idle is how long a kept-alive connection waits for its next request.
	Idle time.Duration
	// MaxHeaderBytes bounds a request's headers.
	MaxHeaderBytes int
}

// DefaultTimeouts are the chart's.
func DefaultTimeouts() Timeouts {
	return Timeouts{
		ReadHeader: 10 * time.Second,
		// The longest an API server waits for a webhook (timeoutSeconds is at most 30): a request
		// still arriving after that can no longer be answered in time.
		Read: 30 * time.Second,
		// Longer than the API server's webhook client keeps an idle connection (90 s, client-go's
		// transport defaults), so that the client is always the one that closes it. The server's
		// clock starts as it writes an answer, the client's once it has read it: at equal
		// timeouts the server closed first, and a review the client wrote to the connection in
		// that moment failed with EOF (a POST is not retried).
		Idle:           2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
	}
}

// webhookServer is controller-runtime's webhook server with Timeouts: handlers are registered
// through the embedded DefaultServer, which instruments them with the request metrics, onto mux;
// Start serves mux itself, with the DefaultServer's TLS and certificate reloading but an
// http.Server of its own.
type webhookServer struct {
	webhook.Server
	opts     webhook.Options
	timeouts Timeouts
	limits   limits
	started  atomic.Bool
	// draining: every answer from now on closes its connection (see drain), and the replica
	// reports not ready (Run).
	draining atomic.Bool
}

// limits bound what the webhook server holds at once.
type limits struct {
	// requests handled (limitInFlight); connections open (netutil.LimitListener); connections
	// taken into a handshake a second (pacedListener).
	requests, connections, handshakes int
}

func newWebhookServer(opts webhook.Options, timeouts Timeouts, l limits) *webhookServer {
	opts.WebhookMux = http.NewServeMux()
	return &webhookServer{Server: webhook.NewServer(opts), opts: opts, timeouts: timeouts, limits: l}
}

// Start serves until ctx ends, then shuts down gracefully as controller-runtime's does.
func (s *webhookServer) Start(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("webhook-server")
	// The protocols and versions are certs.TLSOpts' (NewRunner passes them): HTTP/1.1 only.
	cfg := &tls.Config{}
	for _, op := range s.opts.TLSOpts {
		op(cfg)
	}
	if cfg.GetCertificate == nil {
		watcher, err := certwatcher.New(filepath.Join(s.opts.CertDir, s.opts.CertName), filepath.Join(s.opts.CertDir, s.opts.KeyName))
		if err != nil {
			return fmt.Errorf("serving certificate: %w", err)
		}
		cfg.GetCertificate = watcher.GetCertificate
		go func() {
			if err := watcher.Start(ctx); err != nil {
				logger.Error(err, "Certificate watcher failed")
			}
		}()
	}
	tcp, err := net.Listen("tcp", s.addr())
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// Past the limit a connection is accepted (and its handshake made) only once another closes:
	// the client's waiting requests take the connections it has as they free up. The pacing sits
	// under the limit so that it sees the TCP connection itself (peerGone).
	listener := tls.NewListener(netutil.LimitListener(newPacedListener(tcp, s.limits.handshakes), s.limits.connections), cfg)
	srv := &http.Server{
		Handler:           s.closeWhenDraining(limitInFlight(s.opts.WebhookMux, s.limits.requests)),
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ReadHeaderTimeout: s.timeouts.ReadHeader,
		ReadTimeout:       s.timeouts.Read,
		IdleTimeout:       s.timeouts.Idle,
		MaxHeaderBytes:    s.timeouts.MaxHeaderBytes,
	}
	logger.Info("Serving webhooks", "address", s.addr(), "timeouts", s.timeouts, "maxRequestsInFlight", s.limits.requests, "maxConnections", s.limits.connections, "maxHandshakesPerSecond", s.limits.handshakes)
	s.started.Store(true)
	return serveUntilDone(ctx, srv, listener, "webhook server")
}

// drain makes every answer from now on close its connection. The API server keeps its
// connections to a replica alive, and conntrack keeps them going to it after the endpoints dropped
// it, so a draining replica still gets every review until it closes them. Closed idle, as
// http.Server.Shutdown and SetKeepAlivesEnabled(false) do, a connection the API server is writing
// a review to at that moment fails it with EOF (a POST is not retried). Closed after an answer
// that says so, the API server's next review dials again and reaches a replica that stays.
func (s *webhookServer) drain() { s.draining.Store(true) }

func (s *webhookServer) closeWhenDraining(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}

func (s *webhookServer) addr() string {
	return net.JoinHostPort(s.opts.Host, strconv.Itoa(s.opts.Port))
}

// StartedChecker is healthy once the server accepts TLS connections, as controller-runtime's is.
func (s *webhookServer) StartedChecker() healthz.Checker {
	return func(*http.Request) error {
		if !s.started.Load() {
			return errors.New("webhook server has not been started yet")
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", s.addr(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only whether it answers
		if err != nil {
			return fmt.Errorf("webhook server is not reachable: %w", err)
		}
		return conn.Close()
	}
}
