package server

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// TestShutdownDelay: after the signal the webhook reports not ready but keeps answering, on the
// API server's kept-alive connection and on new ones, for the whole delay, each answer closing its
// connection so that the client's next request dials again; then it stops taking connections and
// still answers the request in flight before Run returns.
func TestShutdownDelay(t *testing.T) {
	dir := t.TempDir()
	writeCert(t, dir, 1)
	o := NewOptions()
	o.CertDir = dir
	o.Namespace = "default"
	o.MetricsBindAddress = "0"
	o.HealthProbeBindAddress = freeAddr(t)
	o.ShutdownDelay = 2 * time.Second
	addr := freeAddr(t)
	host, port, _ := net.SplitHostPort(addr)
	o.Host = host
	o.Port, _ = strconv.Atoi(port)
	runner, err := NewRunner(&rest.Config{Host: "https://127.0.0.1:1"}, o)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	runner.GetWebhookServer().Register("/ping", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	runner.GetWebhookServer().Register("/slow", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
		w.WriteHeader(http.StatusOK)
	}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, runner, o) }()

	// The API server's webhook client keeps its connection alive between reviews.
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the test does not authenticate the server
	}, Timeout: 20 * time.Second}
	// pinged is how one ping went: on a kept-alive connection, and whether the answer closed it.
	type pinged struct{ reused, closed bool }
	ping := func(c *http.Client) (pinged, error) {
		var got pinged
		trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { got.reused = info.Reused }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace),
			http.MethodPost, "https://"+addr+"/ping", strings.NewReader("{}"))
		if err != nil {
			return got, err
		}
		resp, err := c.Do(req)
		if err != nil {
			return got, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		got.closed = resp.Close
		return got, nil
	}
	waitFor(t, "the webhook server", func() bool { _, err := ping(client); return err == nil })
	if got, err := ping(client); err != nil || !got.reused || got.closed {
		t.Fatalf("before the signal: %+v, %v; want the connection kept alive", got, err)
	}
	waitFor(t, "ready", func() bool { return readyz(o.HealthProbeBindAddress) == http.StatusOK })

	cancel()
	waitFor(t, "not ready after the signal", func() bool { return readyz(o.HealthProbeBindAddress) == http.StatusInternalServerError })
	if got, err := ping(client); err != nil {
		t.Errorf("during the delay, on the open connection: %v", err)
	} else if !got.reused || !got.closed {
		t.Errorf("during the delay, on the open connection: %+v; want it answered and then closed", got)
	}
	if got, err := ping(client); err != nil {
		t.Errorf("during the delay, after the answer that closed the connection: %v", err)
	} else if got.reused {
		t.Error("during the delay, the client reused a connection the answer said was closing")
	}
	fresh := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // as above
	if got, err := ping(fresh); err != nil {
		t.Errorf("during the delay, on a new connection: %v", err)
	} else if !got.closed {
		t.Error("during the delay, an answer on a new connection kept it alive")
	}
	slow := make(chan error, 1)
	go func() {
		resp, err := client.Get("https://" + addr + "/slow")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = &statusError{resp.StatusCode}
			}
		}
		slow <- err
	}()
	<-entered
	waitFor(t, "the listener closed after the delay", func() bool {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
		}
		return err != nil
	})
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) with a request in flight", err)
	default:
	}
	close(release)
	if err := <-slow; err != nil {
		t.Errorf("request in flight at shutdown: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

type statusError struct{ code int }

func (e *statusError) Error() string { return http.StatusText(e.code) }

func readyz(addr string) int {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestAfterDelay: the returned context ends no sooner than the delay after its parent, keeps the
// parent's values, and the callback runs when the parent ends.
func TestAfterDelay(t *testing.T) {
	type key struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	called := make(chan time.Time, 1)
	serve := afterDelay(parent, 200*time.Millisecond, func() { called <- time.Now() })
	if serve.Value(key{}) != "v" {
		t.Error("values of the parent lost")
	}
	select {
	case <-serve.Done():
		t.Fatal("ended before its parent")
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	<-serve.Done()
	if since := time.Since(<-called); since < 200*time.Millisecond {
		t.Errorf("ended %s after the signal, want at least the delay", since)
	}
}
