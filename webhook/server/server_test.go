package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"math"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation"
	"github.com/gpu-dra/gpu-dra/webhook/podinject"
)

// TestFlags: list flags are comma-separated, and a later use replaces the list.
func TestFlags(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "gpu-dra")
	for _, tc := range []struct {
		name       string
		args       []string
		deny       []claimvalidation.Rule
		namespaces []string
		classes    []podinject.DeviceClass
		wantErr    string
	}{
		{name: "none"},
		{name: "deny list", args: []string{"--deny=missing-class, unsatisfiable,"}, deny: []claimvalidation.Rule{claimvalidation.RuleMissingClass, claimvalidation.RuleUnsatisfiable}},
		{name: "deny replaced", args: []string{"--deny=missing-class", "--deny=deprecated-version"}, deny: []claimvalidation.Rule{claimvalidation.RuleDeprecatedVersion}},
		{name: "deny emptied", args: []string{"--deny=missing-class", "--deny="}},
		{name: "unknown rule", args: []string{"--deny=typo"}, wantErr: `invalid value "typo" for flag -deny: unknown rule "typo"`},
		{name: "switches are gone", args: []string{"--deny-deprecated-version"}, wantErr: "flag provided but not defined: -deny-deprecated-version"},
		{name: "excluded namespaces", args: []string{"--excluded-namespaces=kube-system, gpu-dra,", "--excluded-namespaces=more,other"}, namespaces: []string{"more", "other"}},
		{name: "device classes", args: []string{"--device-classes=old.example.com", "--device-classes=gpu.example.com=gpu.example.com/gpu,gpu-timesliced.example.com"},
			classes: []podinject.DeviceClass{{Name: "gpu.example.com", ExtendedResourceName: "gpu.example.com/gpu"}, {Name: "gpu-timesliced.example.com"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(new(discard))
			o.AddFlags(fs)
			err := fs.Parse(tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(o.Deny, tc.deny) || !reflect.DeepEqual(o.ExcludedNamespaces, tc.namespaces) || !reflect.DeepEqual(o.DeviceClasses, tc.classes) {
				t.Errorf("deny %v, excluded namespaces %q, classes %+v; want %v, %q, %+v", o.Deny, o.ExcludedNamespaces, o.DeviceClasses, tc.deny, tc.namespaces, tc.classes)
			}
			if err := o.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

// TestValidate: every bad option is reported at once, each naming its flag.
func TestValidate(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "")
	o := NewOptions()
	o.DriverName = "GPU_Example"
	o.Port = 0
	o.MaxTemplatesPerNamespace = 0
	o.MaxRequestsInFlight = 0
	o.HealthProbeBindAddress = ""
	o.MetricsBindAddress = ":http-metrics"
	o.ShutdownDelay = -time.Second
	o.DeviceClasses = []podinject.DeviceClass{{Name: "bad", ExtendedResourceName: "kubernetes.io/gpu"}, {ExtendedResourceName: "example.com/gpu"}}
	err := o.Validate()
	if err == nil {
		t.Fatal("Validate accepted every bad option")
	}
	for _, want := range []string{`--driver-name="GPU_Example"`, "--port=0", "--max-templates-per-namespace=0", "--max-requests-in-flight=0: use 1..4096", `--health-probe-bind-address=""`,
		`--metrics-bind-address=":http-metrics"`, "--device-classes: bad=kubernetes.io/gpu", "--device-classes: an entry has no class name",
		"--namespace: required (default $POD_NAMESPACE)", "--shutdown-delay=-1s: use 0s..5m0s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v\nwant it to name %s", err, want)
		}
	}
	t.Setenv("POD_NAMESPACE", "gpu-dra")
	for n, want := range map[int]string{1: "", maxMaxRequestsInFlight: "", maxMaxRequestsInFlight + 1: "--max-requests-in-flight=4097: use 1..4096, e.g. 64", math.MaxInt: "use 1..4096", -1: "--max-requests-in-flight=-1: use 1..4096", math.MinInt: "use 1..4096"} {
		o := NewOptions()
		o.MaxRequestsInFlight = n
		if err := o.Validate(); (err == nil) != (want == "") || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("--max-requests-in-flight=%d: Validate = %v, want %q", n, err, want)
		}
	}
	for _, tc := range []struct {
		requests, connections int
		want                  string
	}{
		{requests: 64, connections: 0},
		{requests: 64, connections: 64},
		{requests: 4096, connections: maxMaxConnections},
		{requests: 64, connections: 63, want: "--max-connections=63: use 0 (--max-requests-in-flight and 192) or 64..65536"},
		{requests: 8, connections: -1, want: "--max-connections=-1: use 0"},
		{requests: 8, connections: maxMaxConnections + 1, want: "--max-connections=65537: use 0"},
		{requests: 8, connections: math.MaxInt, want: "use 0"},
	} {
		o := NewOptions()
		o.MaxRequestsInFlight, o.MaxConnections = tc.requests, tc.connections
		if err := o.Validate(); (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("--max-requests-in-flight=%d --max-connections=%d: Validate = %v, want %q", tc.requests, tc.connections, err, tc.want)
		}
	}
	for n, want := range map[int]string{1: "", maxHandshakesPerSecond: "", 0: "--max-handshakes-per-second=0: use 1..10000, e.g. 50", maxHandshakesPerSecond + 1: "--max-handshakes-per-second=10001: use 1..10000", -1: "use 1..10000", math.MaxInt: "use 1..10000"} {
		o := NewOptions()
		o.MaxHandshakesPerSecond = n
		if err := o.Validate(); (err == nil) != (want == "") || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("--max-handshakes-per-second=%d: Validate = %v, want %q", n, err, want)
		}
	}
	if o := NewOptions(); o.maxConnections() != DefaultMaxRequestsInFlight+idleRoom {
		t.Errorf("default connections %d, want %d", o.maxConnections(), DefaultMaxRequestsInFlight+idleRoom)
	}
	if o := NewOptions(); o.Namespace != "gpu-dra" {
		t.Errorf("namespace %q, want $POD_NAMESPACE", o.Namespace)
	} else if err := o.Validate(); err != nil {
		t.Errorf("defaults with $POD_NAMESPACE: %v", err)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func writeCert(t *testing.T, dir string, serial int64) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "gpu-dra-webhook"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// Key first: the watcher reloads on the certificate's change and needs the matching key.
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func servedSerial(addr string, cfg *tls.Config) (int64, error) {
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64(), nil
}

// startWebhookServer starts a runner whose webhook server, configured by o (certificate in
// o.CertDir), serves only handler at /ping, and returns the server's address once it handshakes.
func startWebhookServer(t *testing.T, o *Options, handler http.Handler) string {
	t.Helper()
	host, portStr, err := net.SplitHostPort(freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	o.Host = host
	o.Port, _ = strconv.Atoi(portStr)
	o.HealthProbeBindAddress, o.MetricsBindAddress = "0", "0"
	o.Namespace = "default"
	// No API server is needed: nothing here reads from it.
	runner, err := NewRunner(&rest.Config{Host: "https://127.0.0.1:1"}, o)
	if err != nil {
		t.Fatal(err)
	}
	// Setup would also start informers; the server only needs a handler to serve.
	runner.GetWebhookServer().Register("/ping", handler)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runner.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	addr := net.JoinHostPort(host, portStr)
	waitFor(t, "the webhook server", func() bool {
		select {
		case err := <-done:
			t.Fatalf("runner stopped: %v", err)
		default:
		}
		_, err := servedSerial(addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only whether it answers
		return err == nil
	})
	return addr
}

// TestCertificateReload: a renewed certificate in --cert-dir is served without a restart, and
// the server speaks TLS 1.2+ only.
func TestCertificateReload(t *testing.T) {
	dir := t.TempDir()
	writeCert(t, dir, 1)
	o := NewOptions()
	o.CertDir = dir
	addr := startWebhookServer(t, o, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	client := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the test reads the served certificate, it does not trust it
	waitFor(t, "serial 1", func() bool {
		s, err := servedSerial(addr, client)
		if err != nil {
			t.Log(err)
		}
		return err == nil && s == 1
	})

	if _, err := servedSerial(addr, &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS11}); err == nil { //nolint:gosec
		t.Error("TLS 1.1 handshake succeeded")
	}

	writeCert(t, dir, 2)
	waitFor(t, "serial 2 after renewal", func() bool { s, err := servedSerial(addr, client); return err == nil && s == 2 })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}
