package faults

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// TestConfigMapSourceOnAPIServer runs the plugins of two nodes against a real kube-apiserver and
// sets a fault of the first: it reaches the first plugin, and not one byte of it reaches the
// second, whose connection carries only its own node's object. The old single ConfigMap, with
// entries for both nodes, is ignored by both.
func TestConfigMapSourceOnAPIServer(t *testing.T) {
	srv := testapiserver.Start(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if _, err := srv.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gpu-dra"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cms := srv.Clientset.CoreV1().ConfigMaps("gpu-dra")
	old := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gpu-dra-faults"}, Data: map[string]string{"node-a": entry("OLD"), "node-b": entry("OLD")}}
	if _, err := cms.Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Create(ctx, NewObject("gpu-dra", "gpu-dra-faults", "node-b", entry("B-OWN"), nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	run := func(node string) (*Tracker, *tap) {
		cfg := rest.CopyConfig(srv.Config)
		w := &tap{}
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return w.wrap(rt) })
		tr := NewTracker(&ConfigMapSource{Client: kubernetes.NewForConfigOrDie(cfg), Namespace: "gpu-dra", Name: "gpu-dra-faults", NodeName: node})
		go func() { _ = tr.Run(ctx) }()
		return tr, w
	}
	a, _ := run("node-a")
	b, bWire := run("node-b")
	waitFor(t, func() bool { return b.Faults()["gpu-1"].Message == "B-OWN" })

	if _, err := cms.Create(ctx, NewObject("gpu-dra", "gpu-dra-faults", "node-a", entry("A-SECRET-MARK"), nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return a.Faults()["gpu-1"].Message == "A-SECRET-MARK" })
	time.Sleep(time.Second) // what else the server would send node-b has been sent by now
	if bytes.Contains(bWire.bytes(), []byte("A-SECRET-MARK")) {
		t.Error("node-a's fault reached node-b's plugin")
	}
	if bytes.Contains(bWire.bytes(), []byte("OLD")) {
		t.Error("the old single ConfigMap reached node-b's plugin")
	}
	if got := b.Faults()["gpu-1"].Message; got != "B-OWN" {
		t.Errorf("node-b's fault is %q, want its own", got)
	}
}

// tap keeps every response body a client reads.
type tap struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *tap) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err == nil {
			resp.Body = &tappedBody{ReadCloser: resp.Body, w: w}
		}
		return resp, err
	})
}

func (w *tap) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.buf.Bytes())
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

type tappedBody struct {
	io.ReadCloser
	w *tap
}

func (b *tappedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.w.mu.Lock()
	b.w.buf.Write(p[:n])
	b.w.mu.Unlock()
	return n, err
}
