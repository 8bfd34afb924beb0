package certs

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/internal/cliflag"
)

// Modes of --cert-mode.
const (
	// ModeSelf: the webhook issues, stores, renews and distributes its own certificate.
	ModeSelf = "self"
	// ModeFile: someone else (cert-manager, a user's Secret) puts tls.crt/tls.key in the cert
	// dir; the webhook server's cert watcher reloads them.
	ModeFile = "file"
)

// DefaultSyncInterval is how often each replica re-reads the Secret: how late a replica at worst
// picks up a certificate another replica renewed, and how late an expiring one is noticed.
const DefaultSyncInterval = time.Minute

// Options configure the certificates of cmd/gpu-webhook.
type Options struct {
	Mode string
	// SecretName, Namespace: the Secret shared by the replicas (self mode).
	SecretName string
	Namespace  string
	// ServiceName: the webhook Service; the certificate is issued for its DNS names.
	ServiceName string
	// ValidatingWebhookConfig, MutatingWebhookConfig: configurations whose caBundle is kept
	// current (self mode); empty skips one.
	ValidatingWebhookConfig string
	MutatingWebhookConfig   string
	SyncInterval            time.Duration
	Lifetimes               Lifetimes
}

// NewOptions returns the defaults; the namespace comes from $POD_NAMESPACE (downward API).
func NewOptions() *Options {
	return &Options{Mode: ModeFile, Namespace: cliflag.PodNamespace(), SyncInterval: DefaultSyncInterval}
}

// AddFlags registers the certificate flags on fs, with the current values as defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Mode, "cert-mode", o.Mode, `"self": create, store (--cert-secret), renew and distribute the serving certificate and patch caBundle; "file": serve tls.crt/tls.key that cert-manager or a user's Secret puts in --cert-dir`)
	fs.StringVar(&o.SecretName, "cert-secret", o.SecretName, "self mode: Secret holding the CA and serving certificate, shared by all replicas")
	fs.StringVar(&o.Namespace, "cert-namespace", o.Namespace, "self mode: namespace of --cert-secret (default $POD_NAMESPACE)")
	fs.StringVar(&o.ServiceName, "webhook-service", o.ServiceName, "self mode: the webhook's Service; the certificate names <svc>, <svc>.<ns>, <svc>.<ns>.svc and <svc>.<ns>.svc.cluster.local")
	fs.StringVar(&o.ValidatingWebhookConfig, "validating-webhook-config", o.ValidatingWebhookConfig, "self mode: ValidatingWebhookConfiguration whose webhooks get the caBundle")
	fs.StringVar(&o.MutatingWebhookConfig, "mutating-webhook-config", o.MutatingWebhookConfig, "self mode: MutatingWebhookConfiguration whose webhooks get the caBundle")
	fs.DurationVar(&o.SyncInterval, "cert-sync-interval", o.SyncInterval, "self mode: how often each replica re-reads the Secret and renews if needed")
}

// Validate names the flag to fix.
func (o *Options) Validate() error {
	switch o.Mode {
	case ModeFile:
		return nil
	case ModeSelf:
	default:
		return fmt.Errorf("--cert-mode=%q: use %q or %q", o.Mode, ModeSelf, ModeFile)
	}
	var errs []error
	for _, f := range []struct{ flag, value string }{
		{"--cert-secret", o.SecretName},
		{"--cert-namespace (or $POD_NAMESPACE)", o.Namespace},
		{"--webhook-service", o.ServiceName},
	} {
		if f.value == "" {
			errs = append(errs, fmt.Errorf("%s is required with --cert-mode=self", f.flag))
		}
	}
	if o.SyncInterval <= 0 {
		errs = append(errs, fmt.Errorf("--cert-sync-interval=%s: must be positive, e.g. 1m", o.SyncInterval))
	}
	return errors.Join(errs...)
}

// Syncer runs on every replica (it needs no leader: the Secret's resourceVersion decides which
// replica's renewal wins): it keeps the Secret valid, the caBundle patched and certDir current.
type Syncer struct {
	Store    *SecretStore
	Patcher  *CABundlePatcher
	CertDir  string
	Interval time.Duration
}

// NewSyncer builds the self-mode Syncer for certDir from validated options.
func NewSyncer(client kubernetes.Interface, o *Options, certDir string) *Syncer {
	return &Syncer{
		Store: &SecretStore{
			Client:    client.CoreV1(),
			Namespace: o.Namespace,
			Name:      o.SecretName,
			DNSNames:  DNSNames(o.ServiceName, o.Namespace),
			Lifetimes: o.Lifetimes,
		},
		Patcher: &CABundlePatcher{
			Client:     client.AdmissionregistrationV1(),
			Validating: o.ValidatingWebhookConfig,
			Mutating:   o.MutatingWebhookConfig,
		},
		CertDir:  certDir,
		Interval: o.SyncInterval,
	}
}

// Sync makes one pass: Secret, caBundle, files.
func (s *Syncer) Sync(ctx context.Context) error {
	b, err := s.Store.Ensure(ctx)
	if err != nil {
		return err
	}
	if err := s.Patcher.Patch(ctx, b.CACert); err != nil {
		return err
	}
	changed, err := WriteFiles(s.CertDir, b)
	if err != nil {
		return err
	}
	if changed {
		klog.FromContext(ctx).Info("Wrote serving certificate", "dir", s.CertDir)
	}
	return nil
}

// Start syncs every Interval until ctx ends; failures are logged and retried sooner.
func (s *Syncer) Start(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("certs")
	ctx = klog.NewContext(ctx, logger)
	interval := s.Interval
	if interval <= 0 {
		interval = DefaultSyncInterval
	}
	wait.JitterUntilWithContext(ctx, func(ctx context.Context) {
		backoff := wait.Backoff{Duration: time.Second, Factor: 2, Steps: 6, Cap: interval}
		_ = wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
			if err := s.Sync(ctx); err != nil {
				logger.Error(err, "Certificate sync failed; retrying")
				return false, nil
			}
			return true, nil
		})
	}, interval, 0.1, true)
	return nil
}

// NeedLeaderElection is false, for a controller-runtime manager that runs the Syncer: every
// replica must keep its own cert dir current.
func (s *Syncer) NeedLeaderElection() bool { return false }

// Setup prepares the serving certificate before the webhook server starts (controller-runtime's
// server refuses to start without tls.crt/tls.key in certDir). In self mode it returns the Syncer
// that keeps the certificate current, for the caller to run beside the server; in file mode nil.
// It blocks until the first sync succeeds or ctx ends.
func Setup(ctx context.Context, cfg *rest.Config, o *Options, certDir string) (*Syncer, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Mode == ModeFile {
		for _, f := range []string{TLSCertKey, TLSKeyKey} {
			if _, err := os.Stat(filepath.Join(certDir, f)); err != nil {
				return nil, fmt.Errorf("--cert-mode=file: %w; mount the serving Secret at --cert-dir or use --cert-mode=self", err)
			}
		}
		return nil, nil
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("certs client: %w", err)
	}
	s := NewSyncer(client, o, certDir)
	if err := s.SyncUntilReady(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// SyncUntilReady retries Sync until it succeeds once or ctx ends.
func (s *Syncer) SyncUntilReady(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("certs")
	ctx = klog.NewContext(ctx, logger)
	var last error
	err := wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		if last = s.Sync(ctx); last != nil {
			logger.Error(last, "Initial certificate sync failed; retrying")
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("initial certificate sync: %w (last error: %v)", err, last)
	}
	return nil
}

// TLSOpts are for controller-runtime's webhook.Options.TLSOpts: TLS 1.2 or newer, and on 1.2
// only AEAD suites with forward secrecy (TLS 1.3 suites are not configurable and all modern).
// HTTP/2 is off: the API server speaks HTTP/1.1 to webhooks, and it closes the HTTP/2
// rapid-reset attack surface (CVE-2023-44487).
func TLSOpts() []func(*tls.Config) {
	return []func(*tls.Config){func(c *tls.Config) {
		c.MinVersion = tls.VersionTLS12
		c.CipherSuites = []uint16{
			tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
			tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
		}
		c.NextProtos = []string{"http/1.1"}
	}}
}
