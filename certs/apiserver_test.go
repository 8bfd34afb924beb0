package certs_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/ptr"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/gpu-dra/gpu-dra/certs"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

const (
	ns      = "gpu-dra"
	service = "gpu-dra-webhook"
	secret  = "gpu-dra-webhook-tls"
	cfgName = "gpu-dra-webhook"
)

// TestAgainstAPIServer runs the certificate machinery against a real kube-apiserver.
func TestAgainstAPIServer(t *testing.T) {
	srv := testapiserver.Start(t)
	ctx := t.Context()
	cs := srv.Clientset
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("CABundlePatcher", func(t *testing.T) { testPatcher(t, cs) })
	t.Run("SecretConflict", func(t *testing.T) { testSecretConflict(t, cs) })
	t.Run("TwoReplicas", func(t *testing.T) { testTwoReplicas(t, srv) })
}

func webhookConfigs(t *testing.T, cs kubernetes.Interface, name string, validating, mutating int) {
	t.Helper()
	ctx := t.Context()
	cc := func(path string) admissionregistrationv1.WebhookClientConfig {
		return admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: service, Path: ptr.To(path)}}
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for i := range validating {
		vwc.Webhooks = append(vwc.Webhooks, admissionregistrationv1.ValidatingWebhook{
			Name: fmt.Sprintf("v%d.gpu.example.com", i), ClientConfig: cc("/validate"),
			SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNone), AdmissionReviewVersions: []string{"v1"},
		})
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for i := range mutating {
		mwc.Webhooks = append(mwc.Webhooks, admissionregistrationv1.MutatingWebhook{
			Name: fmt.Sprintf("m%d.gpu.example.com", i), ClientConfig: cc("/mutate"),
			SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNoneOnDryRun), AdmissionReviewVersions: []string{"v1"},
		})
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, vwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, mwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// caBundles reads back the caBundle of every webhook of both configurations.
func caBundles(t *testing.T, cs kubernetes.Interface, name string) (bundles [][]byte, versions [2]string) {
	t.Helper()
	vwc, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mwc, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range vwc.Webhooks {
		bundles = append(bundles, w.ClientConfig.CABundle)
	}
	for _, w := range mwc.Webhooks {
		bundles = append(bundles, w.ClientConfig.CABundle)
	}
	return bundles, [2]string{vwc.ResourceVersion, mwc.ResourceVersion}
}

func testPatcher(t *testing.T, cs kubernetes.Interface) {
	ctx := t.Context()
	webhookConfigs(t, cs, "patcher", 2, 1)
	webhookConfigs(t, cs, "bystander", 1, 1)
	p := &certs.CABundlePatcher{Client: cs.AdmissionregistrationV1(), Validating: "patcher", Mutating: "patcher"}
	for _, ca := range [][]byte{[]byte("first-ca"), []byte("second-ca")} {
		if err := p.Patch(ctx, ca); err != nil {
			t.Fatalf("Patch: %v", err)
		}
		got, rv := caBundles(t, cs, "patcher")
		if len(got) != 3 {
			t.Fatalf("read back %d webhooks, want 3", len(got))
		}
		for i, b := range got {
			if !bytes.Equal(b, ca) {
				t.Errorf("webhook %d caBundle = %q, want %q", i, b, ca)
			}
		}
		// Patching the same CA again writes nothing.
		if err := p.Patch(ctx, ca); err != nil {
			t.Fatal(err)
		}
		if _, rv2 := caBundles(t, cs, "patcher"); rv2 != rv {
			t.Errorf("unchanged caBundle rewritten: resourceVersion %v -> %v", rv, rv2)
		}
	}
	if other, _ := caBundles(t, cs, "bystander"); len(other[0]) != 0 || len(other[1]) != 0 {
		t.Errorf("patched a configuration it was not given: %q", other)
	}
	missing := &certs.CABundlePatcher{Client: cs.AdmissionregistrationV1(), Validating: "does-not-exist"}
	if err := missing.Patch(ctx, []byte("x")); err == nil || !strings.Contains(err.Error(), "ValidatingWebhookConfiguration does-not-exist") {
		t.Errorf("missing configuration: err = %v, want one naming it", err)
	}
}

// racingSecrets lets the test run something between a replica's read and its write, so that
// the interleaving of two replicas is certain rather than left to chance.
type racingSecrets struct {
	corev1client.SecretsGetter
	beforeUpdate func()
}

func (r racingSecrets) Secrets(namespace string) corev1client.SecretInterface {
	return racingSecret{r.SecretsGetter.Secrets(namespace), r.beforeUpdate}
}

type racingSecret struct {
	corev1client.SecretInterface
	beforeUpdate func()
}

func (r racingSecret) Update(ctx context.Context, s *corev1.Secret, opts metav1.UpdateOptions) (*corev1.Secret, error) {
	if r.beforeUpdate != nil {
		r.beforeUpdate()
	}
	return r.SecretInterface.Update(ctx, s, opts)
}

// testSecretConflict: replica A reads the empty Secret and generates a certificate; before A
// writes, replica B renews and writes. A's update must fail on the resourceVersion, and A must
// re-read and adopt B's certificate instead of overwriting it.
func testSecretConflict(t *testing.T, cs kubernetes.Interface) {
	ctx := t.Context()
	name := "conflict-tls"
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	store := func(getter corev1client.SecretsGetter) *certs.SecretStore {
		return &certs.SecretStore{Client: getter, Namespace: ns, Name: name, DNSNames: certs.DNSNames(service, ns)}
	}
	b := store(cs.CoreV1())
	var bBundle certs.Bundle
	updates := 0
	a := store(racingSecrets{cs.CoreV1(), func() {
		updates++
		if updates == 1 {
			var err error
			if bBundle, err = b.Ensure(ctx); err != nil {
				t.Errorf("replica B: %v", err)
			}
		}
	}})
	aBundle, err := a.Ensure(ctx)
	if err != nil {
		t.Fatalf("replica A: %v", err)
	}
	if updates != 1 {
		t.Errorf("replica A tried %d updates, want 1 (the conflicting one)", updates)
	}
	stored, err := cs.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := certs.FromSecretData(stored.Data)
	if !got.Equal(bBundle) || !aBundle.Equal(bBundle) {
		t.Error("the Secret or replica A does not hold replica B's certificate: two certificates survived the race")
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

type replica struct {
	dir  string
	port int
}

// served returns the leaf certificate a replica's webhook server presents, verified against
// the caBundle as the API server would.
func (r replica) served(caBundle []byte) ([]byte, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caBundle) {
		return nil, fmt.Errorf("caBundle holds no certificate")
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", "127.0.0.1:"+strconv.Itoa(r.port),
		&tls.Config{RootCAs: pool, ServerName: service + "." + ns + ".svc", MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Raw, nil
}

// testTwoReplicas starts two controller-runtime managers, each with certs.Setup and a webhook
// server, against the same Secret, as two webhook replicas would. Exactly one certificate must
// survive, both must serve it, and the caBundle must verify it; after a renewal both serve the
// new one without a restart.
func testTwoReplicas(t *testing.T, srv *testapiserver.Server) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	cs := srv.Clientset
	webhookConfigs(t, cs, cfgName, 1, 1)
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: ns}, Type: corev1.SecretTypeOpaque}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	replicas := []replica{{dir: filepath.Join(t.TempDir(), "a"), port: freePort(t)}, {dir: filepath.Join(t.TempDir(), "b"), port: freePort(t)}}
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(replicas))
	for _, r := range replicas {
		opts := certs.NewOptions()
		opts.Mode = certs.ModeSelf
		opts.Namespace, opts.SecretName, opts.ServiceName = ns, secret, service
		opts.ValidatingWebhookConfig, opts.MutatingWebhookConfig = cfgName, cfgName
		opts.SyncInterval = time.Second
		mgr, err := ctrl.NewManager(srv.Config, ctrl.Options{
			Metrics:                metricsserver.Options{BindAddress: "0"},
			HealthProbeBindAddress: "0",
			WebhookServer:          webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: r.port, CertDir: r.dir, TLSOpts: certs.TLSOpts()}),
		})
		if err != nil {
			t.Fatal(err)
		}
		mgr.GetWebhookServer().Register("/ping", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Both replicas start at once, like a fresh Deployment.
			syncer, err := certs.Setup(ctx, srv.Config, opts, r.dir)
			if err != nil {
				errs <- fmt.Errorf("Setup: %w", err)
				return
			}
			if err := mgr.Add(syncer); err != nil {
				errs <- fmt.Errorf("add the syncer: %w", err)
				return
			}
			go func() {
				if err := mgr.Start(ctx); err != nil {
					errs <- fmt.Errorf("manager: %w", err)
				}
			}()
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}

	converged := func(want *certs.Bundle) certs.Bundle {
		t.Helper()
		var last error
		var stored certs.Bundle
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			s, err := cs.CoreV1().Secrets(ns).Get(ctx, secret, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			stored = certs.FromSecretData(s.Data)
			if want != nil && !stored.Equal(*want) {
				last = fmt.Errorf("Secret does not hold the expected bundle")
				return false, nil
			}
			leaf, _ := pemLeaf(stored.Cert)
			for i, r := range replicas {
				got, err := r.served(stored.CACert)
				if err != nil {
					last = fmt.Errorf("replica %d: %w", i, err)
					return false, nil
				}
				if !bytes.Equal(got, leaf) {
					last = fmt.Errorf("replica %d serves another certificate than the Secret's", i)
					return false, nil
				}
			}
			bundles, _ := caBundles(t, cs, cfgName)
			for _, b := range bundles {
				if !bytes.Equal(b, stored.CACert) {
					last = fmt.Errorf("caBundle differs from the Secret's ca.crt")
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("replicas did not converge: %v (last: %v)", err, last)
		}
		return stored
	}
	first := converged(nil)
	if c := certs.Inspect(first, certs.DNSNames(service, ns), time.Now()); !c.Valid() {
		t.Fatalf("stored bundle: %+v", c)
	}

	// Another replica renews (here: the test writes a fresh bundle); both pick it up from disk.
	renewed, _, err := certs.Renew(certs.Bundle{}, certs.DNSNames(service, ns), time.Now(), certs.Lifetimes{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := cs.CoreV1().Secrets(ns).Get(ctx, secret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Data = renewed.SecretData()
	if _, err := cs.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	converged(&renewed)
}

func pemLeaf(p []byte) ([]byte, error) {
	block, _ := pem.Decode(p)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("no PEM certificate")
	}
	return block.Bytes, nil
}
