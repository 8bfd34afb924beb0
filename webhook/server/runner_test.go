package server

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// runnerOptions are options for a Runner on free loopback ports with a certificate in a
// temporary directory, without metrics.
func runnerOptions(t *testing.T) *Options {
	t.Helper()
	o := NewOptions()
	o.CertDir = t.TempDir()
	writeCert(t, o.CertDir, 1)
	o.Namespace = "default"
	o.MetricsBindAddress = "0"
	o.HealthProbeBindAddress = freeAddr(t)
	host, port, _ := net.SplitHostPort(freeAddr(t))
	o.Host = host
	o.Port, _ = strconv.Atoi(port)
	return o
}

func newTestRunner(t *testing.T, o *Options) *Runner {
	t.Helper()
	r, err := NewRunner(&rest.Config{Host: "https://127.0.0.1:1"}, o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func get(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// TestRunnerProbes: /healthz and /readyz run their checks, and each check answers alone under
// its name.
func TestRunnerProbes(t *testing.T) {
	o := runnerOptions(t)
	r := newTestRunner(t, o)
	if err := r.AddHealthzCheck("ping", func(*http.Request) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := r.AddReadyzCheck("ok", func(*http.Request) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := r.AddReadyzCheck("inventory", func(*http.Request) error { return errors.New("not synced") }); err != nil {
		t.Fatal(err)
	}
	if err := r.AddReadyzCheck("ok", func(*http.Request) error { return nil }); err == nil {
		t.Error("a second readyz check named ok was added")
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	base := "http://" + o.HealthProbeBindAddress
	waitFor(t, "the probes", func() bool { code, _, err := get(base + "/healthz"); return err == nil && code == http.StatusOK })
	for _, tc := range []struct {
		path string
		want int
	}{
		{"/readyz", http.StatusInternalServerError},
		{"/readyz/ok", http.StatusOK},
		{"/readyz/inventory", http.StatusInternalServerError},
		{"/readyz?exclude=inventory", http.StatusOK},
		{"/healthz/ping", http.StatusOK},
	} {
		code, body, err := get(base + tc.path)
		if err != nil || code != tc.want {
			t.Errorf("GET %s: %d %q, %v; want %d", tc.path, code, body, err, tc.want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start: %v", err)
	}
}

// TestRunnerStopsPartsBeforeServers: when the context ends, the informers and the rest stop
// while the webhook server and the probes still answer (a part stopping may still be asked
// whether it is ready), and Start returns once all have stopped.
func TestRunnerStopsPartsBeforeServers(t *testing.T) {
	o := runnerOptions(t)
	r := newTestRunner(t, o)
	r.GetWebhookServer().Register("/ping", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	probed := make(chan error, 1)
	r.Add(RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		_, _, err := get("http://" + o.HealthProbeBindAddress + "/healthz")
		probed <- err
		return nil
	}))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	waitFor(t, "the probes", func() bool { _, _, err := get("http://" + o.HealthProbeBindAddress + "/healthz"); return err == nil })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Start: %v", err)
		}
	case <-time.After(shutdownGrace):
		t.Fatal("Start did not return after the context ended")
	}
	if err := <-probed; err != nil {
		t.Errorf("the probes were gone while a part was stopping: %v", err)
	}
	if _, _, err := get("http://" + o.HealthProbeBindAddress + "/healthz"); err == nil {
		t.Error("the probes still answer after Start returned")
	}
}

// TestRunnerPartFails: a part's error stops the others and is what Start returns.
func TestRunnerPartFails(t *testing.T) {
	r := newTestRunner(t, runnerOptions(t))
	stopped := make(chan struct{})
	r.Add(RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		close(stopped)
		return nil
	}))
	boom := errors.New("informer failed")
	r.Add(RunnableFunc(func(context.Context) error { return boom }))
	if err := r.Start(t.Context()); !errors.Is(err, boom) {
		t.Errorf("Start: %v, want %v", err, boom)
	}
	select {
	case <-stopped:
	default:
		t.Error("the other part was not stopped")
	}
}

// TestRunnerPortInUse: a probe port in use is an error of NewRunner that names the flag.
func TestRunnerPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	o := runnerOptions(t)
	o.HealthProbeBindAddress = l.Addr().String()
	if _, err := NewRunner(&rest.Config{Host: "https://127.0.0.1:1"}, o); err == nil || !strings.Contains(err.Error(), "--health-probe-bind-address") {
		t.Errorf("NewRunner with the probe port in use: %v, want an error naming --health-probe-bind-address", err)
	}
}

// TestRunnerRuntimeMetrics: /metrics serves the process's and the Go runtime's metrics, as it
// did under controller-runtime's manager (dashboards and the scale harness read them).
func TestRunnerRuntimeMetrics(t *testing.T) {
	o := runnerOptions(t)
	o.MetricsBindAddress = freeAddr(t)
	r := newTestRunner(t, o)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	var body string
	waitFor(t, "/metrics", func() bool {
		code, b, err := get("http://" + o.MetricsBindAddress + "/metrics")
		body = b
		return err == nil && code == http.StatusOK
	})
	for _, name := range []string{"go_memstats_heap_inuse_bytes", "go_goroutines", "process_resident_memory_bytes", "go_gc_heap_live_bytes"} {
		if !strings.Contains(body, "\n"+name+" ") {
			t.Errorf("/metrics has no %s", name)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start: %v", err)
	}
}
