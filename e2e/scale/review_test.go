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
	dir := t.TempDir()
	ca, err := writeServingCert(dir)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, certs.TLSCertKey), filepath.Join(dir, certs.TLSKeyKey))
	if err != nil {
		t.Fatal(err)
	}
	const held = 60
	var mu sync.Mutex
	var arrived int
	release := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
			return
		}
		var in admissionv1.AdmissionReview
		_ = json.NewDecoder(r.Body).Decode(&in)
		in.Response = &admissionv1.AdmissionResponse{UID: in.Request.UID, Allowed: true}
		_ = json.NewEncoder(w).Encode(&in)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	defer srv.Close()
	w := &webhook{ca: ca, port: srv.Listener.Addr().(*net.TCPAddr).Port}
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
