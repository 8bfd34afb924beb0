package server

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// blocking is a handler that counts the requests in it and holds each until release is closed.
type blocking struct {
	in, most atomic.Int32
	entered  chan struct{}
	release  chan struct{}
}

func (b *blocking) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	n := b.in.Add(1)
	for m := b.most.Load(); n > m && !b.most.CompareAndSwap(m, n); m = b.most.Load() {
	}
	b.entered <- struct{}{}
	<-b.release
	b.in.Add(-1)
	w.WriteHeader(http.StatusOK)
}

// TestLimitInFlight: of more requests than there are places, as many as there are places are
// handled at once, the others once a place is free, every one answered; and a request that ends
// while it waits leaves without being handled.
func TestLimitInFlight(t *testing.T) {
	const places, requests = 2, 5
	b := &blocking{entered: make(chan struct{}, requests+1), release: make(chan struct{})}
	arrived := make(chan struct{}, requests)
	limited := limitInFlight(b, places)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		limited.ServeHTTP(w, r)
	})
	codes := make([]int, requests)
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/validate", nil))
			codes[i] = rec.Code
		})
	}
	for range requests {
		<-arrived
	}
	for range places {
		<-b.entered
	}
	// Every request has arrived and the places are taken: the others wait. One more, whose
	// request has ended, is turned away without being handled.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ended := make(chan int)
	go func() {
		rec := httptest.NewRecorder()
		limited.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/validate", nil).WithContext(ctx))
		ended <- rec.Code
	}()
	select {
	case code := <-ended:
		if code != http.StatusServiceUnavailable {
			t.Errorf("a request that ended while waiting got %d, want %d", code, http.StatusServiceUnavailable)
		}
	case <-b.entered:
		t.Error("a request that ended while waiting was handled")
	}
	close(b.release)
	wg.Wait()
	if most := b.most.Load(); most != places {
		t.Errorf("%d requests were handled at once, want %d", most, places)
	}
	for i, code := range codes {
		if code != http.StatusOK {
			t.Errorf("request %d: %d, want %d", i, code, http.StatusOK)
		}
	}
}

// TestConnectionsBounded: while reviews queue, the webhook server accepts, and makes the TLS
// handshake of, no more connections than --max-connections, though a client like the API
// server's (client-go's transport dials for every request that finds no idle connection) keeps
// dialing; once the handler is free, every review is answered over the connections it has.
// Unbounded, each waiting review cost a handshake and the handshakes half the webhook's CPU.
func TestConnectionsBounded(t *testing.T) {
	const places, connections, requests = 2, 4, 16
	dir := t.TempDir()
	writeCert(t, dir, 1)
	o := NewOptions()
	o.CertDir = dir
	o.MaxRequestsInFlight, o.MaxConnections = places, connections
	b := &blocking{entered: make(chan struct{}, requests), release: make(chan struct{})}
	addr := startWebhookServer(t, o, b)

	// As client-go's transport cache makes the API server's: 25 idle connections kept a host, so
	// that none of the 4 is closed (and another let in) once the reviews are answered.
	transport := utilnet.SetTransportDefaults(&http.Transport{
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the test does not authenticate the server
		MaxIdleConnsPerHost: 25,
	})
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}
	var handshakes atomic.Int32
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{TLSHandshakeDone: func(_ tls.ConnectionState, err error) {
		if err == nil {
			handshakes.Add(1)
		}
	}})
	codes := make([]int, requests)
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+"/ping", nil)
			if err != nil {
				t.Error(err)
				return
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[i] = resp.StatusCode
		})
	}
	for range places {
		<-b.entered
	}
	// Every place is taken and the other requests dial: none beyond the limit may get through
	// its handshake, however long they try (on loopback all of them would within milliseconds).
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end) && handshakes.Load() <= connections; {
		time.Sleep(20 * time.Millisecond)
	}
	waiting := handshakes.Load()
	close(b.release)
	wg.Wait()
	if n := handshakes.Load(); waiting > connections || n > connections {
		t.Errorf("%d connections made their handshake while reviews waited, %d in all, want at most %d", waiting, n, connections)
	}
	if most := b.most.Load(); most > places {
		t.Errorf("%d requests were handled at once, want at most %d", most, places)
	}
	for i, code := range codes {
		if code != http.StatusOK {
			t.Errorf("request %d: %d, want %d", i, code, http.StatusOK)
		}
	}
}
