package podinject

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/types"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/yaml"
)

// benchPod is a pod as the API server sends it to the webhook: defaulted, a few containers.
func benchPod(b *testing.B) []byte {
	b.Helper()
	data, err := os.ReadFile("testdata/bench-pod.yaml")
	if err != nil {
		b.Fatal(err)
	}
	raw, err := yaml.YAMLToJSON(data)
	if err != nil {
		b.Fatal(err)
	}
	return raw
}

// BenchmarkHandle is the handler alone, in process: the cost the webhook adds per pod.
func BenchmarkHandle(b *testing.B) {
	h, err := NewHandler(&fakeClient{})
	if err != nil {
		b.Fatal(err)
	}
	req := admissionRequest(b, admissionv1.Create, false, benchPod(b))
	b.ReportAllocs()
	for b.Loop() {
		if resp := h.Handle(context.Background(), req); !resp.Allowed || len(resp.Patches) == 0 {
			b.Fatalf("not mutated: %+v", resp.Result)
		}
	}
}

// BenchmarkReview is one AdmissionReview from body to answer, without network: through
// controller-runtime's admission.Webhook and through the handler's one-pass ServeHTTP.
func BenchmarkReview(b *testing.B) {
	body := reviewBody(b, admissionv1.SchemeGroupVersion.String(), admissionRequest(b, admissionv1.Create, false, benchPod(b)))
	for _, name := range []string{"admission.Webhook", "ServeHTTP"} {
		b.Run(name, func(b *testing.B) {
			h, err := NewHandler(&fakeClient{})
			if err != nil {
				b.Fatal(err)
			}
			serve := servers(h)[name]
			if resp := post(b, serve, "application/json", body).Response; !resp.Allowed || len(resp.Patch) == 0 {
				b.Fatalf("not mutated: %+v", resp.Result)
			}
			b.ReportAllocs()
			for b.Loop() {
				serve.ServeHTTP(httptest.NewRecorder(), httpReview("application/json", body))
			}
		})
	}
}

// benchServer is the controller-runtime webhook server with the pod handler on 127.0.0.1 over
// TLS, and a client for it with the connection pool warmed up.
type benchServer struct {
	url    string
	caFile string
	body   []byte // one AdmissionReview of benchPod
	// post sends body once and returns the reply unread; check reads it. The load loop checks
	// the replies after the clock stops, so the sender's JSON decoding does not compete with the
	// server for the two cores (the API server decodes on cores of its own).
	post func() (time.Duration, []byte, error)
}

// send posts one review and checks the reply.
func (s benchServer) send() (time.Duration, error) {
	d, reply, err := s.post()
	if err != nil {
		return 0, err
	}
	return d, checkPatched(reply)
}

func checkPatched(reply []byte) error {
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(reply, &out); err != nil || out.Response == nil || !out.Response.Allowed || len(out.Response.Patch) == 0 {
		return fmt.Errorf("not mutated: %s (%v)", reply, err)
	}
	return nil
}

// startBenchServer serves the handler, or with canned only the handler's answer to the benchmark's
// review, read once: the floor of the measurement, what TLS, HTTP, the sender and the machine
// cost with no admission work at all.
func startBenchServer(b *testing.B, canned bool) benchServer {
	h, err := NewHandler(&fakeClient{})
	if err != nil {
		b.Fatal(err)
	}
	req := admissionRequest(b, admissionv1.Create, false, benchPod(b))
	req.UID = types.UID("uid-0")
	body := reviewBody(b, admissionv1.SchemeGroupVersion.String(), req)
	var serve http.Handler = h
	if canned {
		answer := httptest.NewRecorder()
		h.ServeHTTP(answer, httpReview("application/json", body))
		serve = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(answer.Body.Bytes())
		})
	}
	dir := b.TempDir()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), certPEM, 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), keyPEM, 0o600); err != nil {
		b.Fatal(err)
	}
	port := freePort(b)
	// The webhook at klog's default verbosity logs nothing per review either; discarding keeps the
	// benchmark lines free of the server's start-up messages.
	setControllerRuntimeLogger(logr.Discard())
	// net/http logs handshakes the stopping server cuts off ("TLS handshake error ... context
	// canceled") through the standard logger, into the middle of a benchmark's result line.
	log.SetOutput(io.Discard)
	b.Cleanup(func() { log.SetOutput(os.Stderr) })
	b.Cleanup(startWebhookServer(b, "127.0.0.1", port, dir, serve))

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	client := &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			// A bounded pool, like the API server's, so the measurement is of admission and not
			// of TLS handshakes piling up once a reply is late.
			MaxConnsPerHost:     benchConns,
			MaxIdleConnsPerHost: benchConns,
		},
	}
	srv := benchServer{url: fmt.Sprintf("https://127.0.0.1:%d%s", port, Path), caFile: filepath.Join(dir, "tls.crt"), body: body}
	srv.post = func() (time.Duration, []byte, error) {
		start := time.Now()
		resp, err := client.Post(srv.url, "application/json", bytes.NewReader(srv.body))
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			return 0, nil, err
		}
		return time.Since(start), data, nil
	}
	// Warm the connection pool and the template cache outside the measurement.
	var warm sync.WaitGroup
	for range benchConns {
		warm.Go(func() {
			for range 10 {
				if _, err := srv.send(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	warm.Wait()
	if b.Failed() {
		b.FailNow()
	}
	return srv
}

// benchConns is the connection pool of the load: the API server keeps a similar small pool per
// webhook.
const benchConns = 16

// BenchmarkMutatePodLoopbackTLS sends b.N AdmissionReviews at 1,000 per second (open loop: a
// slow answer does not slow the sender) to the controller-runtime webhook server on 127.0.0.1
// over TLS, and reports the latency percentiles the spec targets (p99 < 1 ms): to the handler,
// and to a server that answers with the handler's answer without computing it (canned-answer, the
// floor of the measurement on this machine). The sender runs in the same process;
// BenchmarkMutatePodLoadTool sends from a separate one. Bound the load with -benchtime, e.g.
// -benchtime=3000x for three seconds.
func BenchmarkMutatePodLoopbackTLS(b *testing.B) {
	b.Run("handler", func(b *testing.B) { benchmarkLoopbackTLS(b, false) })
	b.Run("canned-answer", func(b *testing.B) { benchmarkLoopbackTLS(b, true) })
}

func benchmarkLoopbackTLS(b *testing.B, canned bool) {
	srv := startBenchServer(b, canned)
	post := srv.post

	const interval = time.Millisecond // 1,000 reviews per second
	latencies := make([]time.Duration, b.N)
	replies := make([][]byte, b.N)
	errs := make(chan error, b.N)
	var wg sync.WaitGroup
	// CPU time of client and server together: unlike the percentiles, it does not grow when other
	// processes crowd the machine, so it tells what the latency would be on an idle core.
	var before, after syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &before); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		wg.Go(func() {
			d, reply, err := post()
			if err != nil {
				errs <- err
			}
			latencies[i], replies[i] = d, reply
		})
	}
	wg.Wait()
	b.StopTimer()
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &after); err != nil {
		b.Fatal(err)
	}
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	for _, reply := range replies {
		if err := checkPatched(reply); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(latencies)
	pct := func(p float64) float64 {
		return float64(latencies[min(len(latencies)-1, int(p*float64(len(latencies))))].Microseconds())
	}
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
	b.ReportMetric(float64(latencies[len(latencies)-1].Microseconds()), "max-µs")
	cpu := after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano()
	b.ReportMetric(float64(cpu)/1e3/float64(b.N), "cpu-µs/review")
}

func freePort(b testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
