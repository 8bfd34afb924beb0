package scale

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpu-dra/gpu-dra/certs"
)

// TestReviewerConnections: every reviewer of a webhook shares one client that keeps at most the
// API server's 25 idle connections, and a load counts the connections it dialed. 60 reviews held
// at once dial 60; a second round reuses the 25 kept and dials the other 35 again.
func TestReviewerConnections(t *testing.T) {
	const held = 60
	var mu sync.Mutex
	var arrived int
	release := make(chan struct{})
	w := startAllowing(t, nil, func(r *http.Request) {
		mu.Lock()
		wait := release
		if arrived++; arrived%held == 0 {
			close(release)
			release = make(chan struct{})
		}
		mu.Unlock()
		select {
		case <-wait:
		case <-r.Context().Done():
		}
	})
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Name: "p"}}
	a, err := newReviewer(w, "/a", []runtime.Object{pod})
	if err != nil {
		t.Fatal(err)
	}
	b, err := newReviewer(w, "/b", []runtime.Object{pod})
	if err != nil {
		t.Fatal(err)
	}
	if a.client != b.client {
		t.Fatal("two reviewers of one webhook have a client each; the API server shares one transport")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for round, want := range []int{held, held - apiServerIdleConns} {
		res := drive(ctx, "reviews", 10000, held, a.review)
		if res.Failed > 0 || res.Skipped > 0 {
			t.Fatalf("round %d: %s", round, res)
		}
		if res.Dials != want {
			t.Errorf("round %d: %d connections dialed, want %d (%d idle kept)", round, res.Dials, want, apiServerIdleConns)
		}
		if len(res.Answers) != len(res.Lat) || len(res.Lat) != held {
			t.Errorf("round %d: %d answers with their times, %d latencies, want %d of each", round, len(res.Answers), len(res.Lat), held)
		}
	}
}

// slowAccept lets its first connection in at once and each later one delay after it came, as a
// webhook pacing its handshakes does.
type slowAccept struct {
	net.Listener
	delay    time.Duration
	accepted int
}

func (l *slowAccept) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if l.accepted++; err == nil && l.accepted > 1 {
		time.Sleep(l.delay)
	}
	return conn, err
}

// TestSettleWaitsForDials: a review that dialed and then took a connection another freed leaves
// its dial going; the load ends with it still being made, and settle waits until its handshake
// is done, so that it does not land in the next load.
func TestSettleWaitsForDials(t *testing.T) {
	const delay = 600 * time.Millisecond
	w := startAllowing(t, func(l net.Listener) net.Listener { return &slowAccept{Listener: l, delay: delay} },
		func(*http.Request) { time.Sleep(20 * time.Millisecond) })
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Name: "p"}}
	rv, err := newReviewer(w, "/a", []runtime.Object{pod})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if res := drive(ctx, "one", 1, 1, rv.review); res.Failed > 0 || res.Dials != 1 {
		t.Fatalf("first connection: %s", res)
	}
	// Two at once: one takes the idle connection, the other dials, and takes that connection as
	// soon as the first answer frees it, long before its own dial is let in.
	start := time.Now()
	if res := drive(ctx, "two", 1000, 2, rv.review); res.Failed > 0 {
		t.Fatalf("two at once: %s", res)
	}
	if took := time.Since(start); took >= delay/2 {
		t.Fatalf("two reviews took %s: the second waited for its own dial, nothing left to settle", took)
	}
	if n := w.dialing.Load(); n != 1 {
		t.Fatalf("connections still being made after the load: %d, want 1", n)
	}
	rv.target(0).settle(ctx)
	if n := w.dialing.Load(); n != 0 {
		t.Errorf("after settle: %d connections still being made, want none", n)
	}
	if took := time.Since(start); took < delay*3/4 {
		t.Errorf("settle returned after %s, before the dial was let in (%s)", took, delay)
	}
}

// startAllowing serves AdmissionReviews over TLS on loopback, each allowed once before(r)
// returns, on the listener wrap makes of the test server's (nil: as it is), and returns the
// webhook the harness's reviewers reach it as.
func startAllowing(t *testing.T, wrap func(net.Listener) net.Listener, before func(*http.Request)) *webhook {
	t.Helper()
	dir := t.TempDir()
	ca, err := writeServingCert(dir)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, certs.TLSCertKey), filepath.Join(dir, certs.TLSKeyKey))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		before(r)
		if r.Context().Err() != nil {
			return
		}
		var in admissionv1.AdmissionReview
		_ = json.NewDecoder(r.Body).Decode(&in)
		in.Response = &admissionv1.AdmissionResponse{UID: in.Request.UID, Allowed: true}
		_ = json.NewEncoder(w).Encode(&in)
	}))
	if wrap != nil {
		srv.Listener = wrap(srv.Listener)
	}
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return &webhook{ca: ca, port: srv.Listener.Addr().(*net.TCPAddr).Port}
}
