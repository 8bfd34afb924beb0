package certs

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mustBundle(t testing.TB, names []string, now time.Time, life Lifetimes) Bundle {
	t.Helper()
	b, check, err := Renew(Bundle{}, names, now, life)
	if err != nil {
		t.Fatal(err)
	}
	if !check.RenewCA {
		t.Fatalf("empty bundle: check %+v, want a new CA", check)
	}
	return b
}

func TestGenerate(t *testing.T) {
	for _, tc := range []struct {
		name      string
		service   string
		namespace string
		life      Lifetimes
		wantCA    time.Duration
		wantCert  time.Duration
	}{
		{"defaults", "gpu-dra-webhook", "gpu-dra", Lifetimes{}, 10 * 365 * 24 * time.Hour, 365 * 24 * time.Hour},
		{"short", "svc", "ns", Lifetimes{CA: 48 * time.Hour, Serving: time.Hour}, 48 * time.Hour, time.Hour},
		{"serving capped by CA", "svc", "ns", Lifetimes{CA: time.Hour, Serving: 24 * time.Hour}, time.Hour, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			names := DNSNames(tc.service, tc.namespace)
			b := mustBundle(t, names, t0, tc.life)
			ca, err := parseCert(b.CACert)
			if err != nil {
				t.Fatal(err)
			}
			cert, err := parseCert(b.Cert)
			if err != nil {
				t.Fatal(err)
			}
			if !ca.IsCA || !ca.BasicConstraintsValid || ca.MaxPathLen != 0 || !ca.MaxPathLenZero || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
				t.Errorf("CA: isCA %v maxPathLen %d keyUsage %b", ca.IsCA, ca.MaxPathLen, ca.KeyUsage)
			}
			if cert.IsCA || cert.KeyUsage != x509.KeyUsageDigitalSignature || !slices.Equal(cert.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
				t.Errorf("serving: isCA %v keyUsage %b extKeyUsage %v", cert.IsCA, cert.KeyUsage, cert.ExtKeyUsage)
			}
			if got := ca.NotAfter.Sub(t0); got != tc.wantCA {
				t.Errorf("CA valid for %s after now, want %s", got, tc.wantCA)
			}
			if got := cert.NotAfter.Sub(t0); got != tc.wantCert {
				t.Errorf("serving valid for %s after now, want %s", got, tc.wantCert)
			}
			if !cert.NotBefore.Before(t0) {
				t.Errorf("NotBefore %s is not backdated for clock skew", cert.NotBefore)
			}
			wantNames := []string{tc.service, tc.service + "." + tc.namespace, tc.service + "." + tc.namespace + ".svc", tc.service + "." + tc.namespace + ".svc.cluster.local"}
			if !slices.Equal(cert.DNSNames, wantNames) {
				t.Errorf("SANs = %v, want %v", cert.DNSNames, wantNames)
			}
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(b.CACert)
			for _, n := range wantNames {
				if _, err := cert.Verify(x509.VerifyOptions{DNSName: n, Roots: pool, CurrentTime: t0, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
					t.Errorf("verify for %s: %v", n, err)
				}
			}
			if _, err := cert.Verify(x509.VerifyOptions{DNSName: "other.svc", Roots: pool, CurrentTime: t0}); err == nil {
				t.Error("certificate verifies for a name it was not issued for")
			}
			if _, err := tls.X509KeyPair(b.Cert, b.Key); err != nil {
				t.Errorf("serving pair: %v", err)
			}
		})
	}
}

func TestInspect(t *testing.T) {
	names := DNSNames("svc", "ns")
	life := Lifetimes{CA: 300 * 24 * time.Hour, Serving: 30 * 24 * time.Hour}
	good := mustBundle(t, names, t0, life)
	other := mustBundle(t, names, t0, life)
	// Lifetimes include the hour of backdating: the window opens a third of (validity + skew)
	// before NotAfter.
	servingWindow := t0.Add(30*24*time.Hour - (30*24*time.Hour+clockSkew)/3)
	caWindow := t0.Add(300*24*time.Hour - (300*24*time.Hour+clockSkew)/3)
	for _, tc := range []struct {
		name      string
		b         Bundle
		names     []string
		now       time.Time
		wantCA    bool
		wantServe bool
		reason    string
	}{
		{"fresh", good, names, t0, false, false, ""},
		{"just before serving window", good, names, servingWindow.Add(-time.Minute), false, false, ""},
		{"serving window", good, names, servingWindow, false, true, "less than a third"},
		{"expired", good, names, t0.Add(31 * 24 * time.Hour), false, true, "less than a third"},
		{"CA window", good, names, caWindow, true, true, "CA expires"},
		{"empty", Bundle{}, names, t0, true, true, CACertKey},
		{"garbage CA", Bundle{CACert: []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), CAKey: good.CAKey, Cert: good.Cert, Key: good.Key}, names, t0, true, true, CACertKey},
		{"CA key swapped", Bundle{CACert: good.CACert, CAKey: other.CAKey, Cert: good.Cert, Key: good.Key}, names, t0, true, true, "does not match"},
		{"serving key swapped", Bundle{CACert: good.CACert, CAKey: good.CAKey, Cert: good.Cert, Key: other.Key}, names, t0, false, true, "does not match"},
		{"signed by another CA", Bundle{CACert: good.CACert, CAKey: good.CAKey, Cert: other.Cert, Key: other.Key}, names, t0, false, true, "not signed by the current CA"},
		{"service renamed", good, DNSNames("svc2", "ns"), t0, false, true, "do not cover"},
		{"missing serving cert", Bundle{CACert: good.CACert, CAKey: good.CAKey}, names, t0, false, true, TLSCertKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Inspect(tc.b, tc.names, tc.now)
			if c.RenewCA != tc.wantCA || c.RenewServing != tc.wantServe {
				t.Fatalf("Inspect = %+v, want renewCA %v renewServing %v", c, tc.wantCA, tc.wantServe)
			}
			if !strings.Contains(c.Reason, tc.reason) {
				t.Errorf("reason %q does not mention %q", c.Reason, tc.reason)
			}
			if c.Valid() {
				return
			}
			renewed, _, err := Renew(tc.b, tc.names, tc.now, life)
			if err != nil {
				t.Fatal(err)
			}
			if after := Inspect(renewed, tc.names, tc.now); !after.Valid() {
				t.Errorf("after Renew still %+v", after)
			}
			if !tc.wantCA && !bytes.Equal(renewed.CAKey, tc.b.CAKey) {
				t.Error("serving renewal replaced a healthy CA (the caBundle would change for nothing)")
			}
		})
	}
}

// A renewed CA keeps the old one in ca.crt until it expires: a replica still serving the old
// certificate stays trusted while the others switch.
func TestRenewCAKeepsPreviousCA(t *testing.T) {
	names := DNSNames("svc", "ns")
	life := Lifetimes{CA: 30 * 24 * time.Hour, Serving: 24 * time.Hour}
	old := mustBundle(t, names, t0, life)
	later := t0.Add(25 * 24 * time.Hour) // inside the CA's window, before it expires
	next, check, err := Renew(old, names, later, life)
	if err != nil || !check.RenewCA {
		t.Fatalf("Renew: %+v %v", check, err)
	}
	cas, err := parseCerts(next.CACert)
	if err != nil || len(cas) != 2 {
		t.Fatalf("ca.crt holds %d certificates (%v), want new + previous", len(cas), err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(next.CACert)
	for name, tc := range map[string]struct {
		pem []byte
		at  time.Time
	}{"old": {old.Cert, t0.Add(time.Hour)}, "new": {next.Cert, later}} {
		c, _ := parseCert(tc.pem)
		if _, err := c.Verify(x509.VerifyOptions{DNSName: names[2], Roots: pool, CurrentTime: tc.at}); err != nil {
			t.Errorf("%s serving certificate not trusted by the new caBundle: %v", name, err)
		}
	}
	// Once the previous CA has expired it is dropped at the next renewal.
	much := t0.Add(45 * 24 * time.Hour)
	again, _, err := Renew(next, names, much, life)
	if err != nil {
		t.Fatal(err)
	}
	cas, _ = parseCerts(again.CACert)
	for _, c := range cas {
		if !much.Before(c.NotAfter) {
			t.Errorf("expired CA %s kept in ca.crt", c.NotAfter)
		}
	}
}

func TestWriteFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "serving-certs")
	b := mustBundle(t, DNSNames("svc", "ns"), t0, Lifetimes{})
	changed, err := WriteFiles(dir, b)
	if err != nil || !changed {
		t.Fatalf("first write: changed %v err %v", changed, err)
	}
	if _, err := tls.LoadX509KeyPair(filepath.Join(dir, TLSCertKey), filepath.Join(dir, TLSKeyKey)); err != nil {
		t.Errorf("written pair does not load: %v", err)
	}
	st, err := os.Stat(filepath.Join(dir, TLSKeyKey))
	if err != nil || st.Mode().Perm()&0o077 != 0 {
		t.Errorf("key file mode %v (%v), want no group/other access", st.Mode(), err)
	}
	if changed, err := WriteFiles(dir, b); err != nil || changed {
		t.Errorf("rewrite of the same bundle: changed %v err %v", changed, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 3 {
		t.Errorf("cert dir holds %d entries, want tls.crt, tls.key, ca.crt only (no temp files)", len(entries))
	}
	if _, err := WriteFiles(dir, Bundle{}); err == nil {
		t.Error("empty bundle written")
	}
}

func TestOptions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     string
		wantErr string
	}{
		{"file mode needs nothing", []string{"--cert-mode=file"}, "", ""},
		{"self complete", []string{"--cert-mode=self", "--cert-secret=s", "--webhook-service=svc"}, "gpu-dra", ""},
		{"self without secret", []string{"--cert-mode=self", "--webhook-service=svc"}, "gpu-dra", "--cert-secret is required"},
		{"self without namespace", []string{"--cert-mode=self", "--cert-secret=s", "--webhook-service=svc"}, "", "--cert-namespace"},
		{"namespace flag wins", []string{"--cert-mode=self", "--cert-secret=s", "--webhook-service=svc", "--cert-namespace=x"}, "", ""},
		{"unknown mode", []string{"--cert-mode=acme"}, "", `--cert-mode="acme"`},
		{"bad interval", []string{"--cert-mode=self", "--cert-secret=s", "--webhook-service=svc", "--cert-sync-interval=0s"}, "ns", "--cert-sync-interval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("POD_NAMESPACE", tc.env)
			o := NewOptions()
			fs := flag.NewFlagSet("gpu-webhook", flag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := o.Validate()
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Validate() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestTLSOpts serves with TLSOpts and dials with old protocol versions and weak suites.
func TestTLSOpts(t *testing.T) {
	b := mustBundle(t, DNSNames("svc", "ns"), time.Now(), Lifetimes{})
	pair, err := tls.X509KeyPair(b.Cert, b.Key)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}}
	for _, o := range TLSOpts() {
		o(cfg)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), ReadHeaderTimeout: time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b.CACert)
	for _, tc := range []struct {
		name   string
		client *tls.Config
		ok     bool
	}{
		{"TLS 1.3", &tls.Config{MinVersion: tls.VersionTLS13}, true},
		{"TLS 1.2 ECDHE-GCM", &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}}, true},
		{"TLS 1.1", &tls.Config{MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}, false},
		{"TLS 1.2 CBC", &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA}}, false},
		{"HTTP/2 only", &tls.Config{NextProtos: []string{"h2"}}, false},
		{"HTTP/2 or 1.1 gets 1.1", &tls.Config{NextProtos: []string{"h2", "http/1.1"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client
			c.RootCAs = pool
			c.ServerName = "svc.ns.svc"
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), c)
			if (err == nil) != tc.ok {
				t.Fatalf("handshake err = %v, want success %v", err, tc.ok)
			}
			if err == nil {
				if p := conn.ConnectionState().NegotiatedProtocol; p == "h2" {
					t.Errorf("negotiated %s", p)
				}
				conn.Close()
			}
		})
	}
}

func TestParseKeyErrors(t *testing.T) {
	for _, in := range [][]byte{nil, []byte("not pem"), []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")} {
		if _, err := parseKey(in); err == nil {
			t.Errorf("parseKey(%q) accepted", in)
		}
	}
}

// FuzzInspect: whatever a Secret holds, Inspect never panics, and what Renew makes of it (new
// keys only where Inspect found a problem) is valid.
func FuzzInspect(f *testing.F) {
	b := mustBundle(f, DNSNames("svc", "ns"), t0, Lifetimes{})
	f.Add(b.CACert, b.CAKey, b.Cert, b.Key)
	f.Add([]byte{}, []byte{}, []byte{}, []byte{})
	f.Fuzz(func(t *testing.T, caCert, caKey, cert, key []byte) {
		in := Bundle{CACert: caCert, CAKey: caKey, Cert: cert, Key: key}
		check := Inspect(in, DNSNames("svc", "ns"), t0)
		if check.Valid() || check.RenewCA {
			// Nothing input-dependent happens beyond Inspect on these paths but stillValid.
			_ = stillValid(in.CACert, t0)
			return
		}
		out, _, err := Renew(in, DNSNames("svc", "ns"), t0, Lifetimes{})
		if err != nil {
			t.Fatalf("Renew: %v", err)
		}
		if c := Inspect(out, DNSNames("svc", "ns"), t0); !c.Valid() {
			t.Fatalf("Renew produced %+v", c)
		}
	})
}

func BenchmarkInspect(b *testing.B) {
	bundle := mustBundle(b, DNSNames("svc", "ns"), t0, Lifetimes{})
	for b.Loop() {
		if !Inspect(bundle, DNSNames("svc", "ns"), t0).Valid() {
			b.Fatal("invalid")
		}
	}
}

func BenchmarkRenew(b *testing.B) {
	for b.Loop() {
		if _, _, err := Renew(Bundle{}, DNSNames("svc", "ns"), t0, Lifetimes{}); err != nil {
			b.Fatal(err)
		}
	}
}
