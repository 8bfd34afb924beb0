package certs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/google/renameio/v2"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	admissionv1client "k8s.io/client-go/kubernetes/typed/admissionregistration/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
)

// maxAttempts bounds the read-modify-write loops; each lost race means another replica wrote a
// newer version, so a few rounds always settle.
const maxAttempts = 5

// SecretStore keeps the Bundle in one Secret. Every replica may call Ensure at any time: writes
// carry the resourceVersion that was read, so when two replicas renew at once exactly one update
// lands and the other re-reads and adopts it.
type SecretStore struct {
	Client    corev1client.SecretsGetter
	Namespace string
	Name      string
	DNSNames  []string
	Lifetimes Lifetimes
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Ensure returns a valid Bundle from the Secret, renewing (or creating) it when needed.
func (s *SecretStore) Ensure(ctx context.Context) (Bundle, error) {
	logger := klog.FromContext(ctx).WithValues("secret", klog.KRef(s.Namespace, s.Name))
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	secrets := s.Client.Secrets(s.Namespace)
	for range maxAttempts {
		secret, err := secrets.Get(ctx, s.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			// Normally the chart created it; it was deleted since.
			b, _, err := Renew(Bundle{}, s.DNSNames, now(), s.Lifetimes)
			if err != nil {
				return Bundle{}, err
			}
			secret = &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace},
				Type:       corev1.SecretTypeOpaque,
				Data:       b.SecretData(),
			}
			_, err = secrets.Create(ctx, secret, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if err != nil {
				return Bundle{}, fmt.Errorf("create Secret %s/%s: %w", s.Namespace, s.Name, err)
			}
			logger.Info("Created serving certificate", "dnsNames", s.DNSNames)
			return b, nil
		}
		if err != nil {
			return Bundle{}, fmt.Errorf("get Secret %s/%s: %w", s.Namespace, s.Name, err)
		}
		current := FromSecretData(secret.Data)
		next, check, err := Renew(current, s.DNSNames, now(), s.Lifetimes)
		if err != nil {
			return Bundle{}, fmt.Errorf("renew certificate of Secret %s/%s: %w", s.Namespace, s.Name, err)
		}
		if check.Valid() {
			return current, nil
		}
		if secret.Data == nil {
			secret.Data = map[string][]byte{}
		}
		for k, v := range next.SecretData() {
			secret.Data[k] = v
		}
		_, err = secrets.Update(ctx, secret, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			logger.V(2).Info("Another replica updated the certificate first; re-reading")
			continue
		}
		if err != nil {
			return Bundle{}, fmt.Errorf("update Secret %s/%s: %w", s.Namespace, s.Name, err)
		}
		logger.Info("Renewed serving certificate", "reason", check.Reason, "renewedCA", check.RenewCA)
		return next, nil
	}
	return Bundle{}, fmt.Errorf("update of Secret %s/%s still conflicts after %d attempts", s.Namespace, s.Name, maxAttempts)
}

// CABundlePatcher writes the CA into every webhook of the named configurations. An empty name
// skips that kind.
type CABundlePatcher struct {
	Client     admissionv1client.AdmissionregistrationV1Interface
	Validating string
	Mutating   string
}

// Patch sets caBundle on all webhooks of both configurations, updating only what differs.
func (p *CABundlePatcher) Patch(ctx context.Context, caBundle []byte) error {
	if p.Validating != "" {
		c := p.Client.ValidatingWebhookConfigurations()
		err := patchWebhooks(ctx, "ValidatingWebhookConfiguration", p.Validating, caBundle, c.Get, c.Update,
			func(cfg *admissionregistrationv1.ValidatingWebhookConfiguration) []*admissionregistrationv1.WebhookClientConfig {
				out := make([]*admissionregistrationv1.WebhookClientConfig, len(cfg.Webhooks))
				for i := range cfg.Webhooks {
					out[i] = &cfg.Webhooks[i].ClientConfig
				}
				return out
			})
		if err != nil {
			return err
		}
	}
	if p.Mutating != "" {
		c := p.Client.MutatingWebhookConfigurations()
		return patchWebhooks(ctx, "MutatingWebhookConfiguration", p.Mutating, caBundle, c.Get, c.Update,
			func(cfg *admissionregistrationv1.MutatingWebhookConfiguration) []*admissionregistrationv1.WebhookClientConfig {
				out := make([]*admissionregistrationv1.WebhookClientConfig, len(cfg.Webhooks))
				for i := range cfg.Webhooks {
					out[i] = &cfg.Webhooks[i].ClientConfig
				}
				return out
			})
	}
	return nil
}

// patchWebhooks re-reads one webhook configuration, sets caBundle on every webhook in it and
// updates it when anything changed, retrying on conflicts with other writers.
func patchWebhooks[T any](ctx context.Context, kind, name string, caBundle []byte,
	get func(context.Context, string, metav1.GetOptions) (*T, error),
	update func(context.Context, *T, metav1.UpdateOptions) (*T, error),
	clientConfigs func(*T) []*admissionregistrationv1.WebhookClientConfig,
) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cfg, err := get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		changed := false
		for _, cc := range clientConfigs(cfg) {
			changed = setCABundle(cc, caBundle) || changed
		}
		if !changed {
			return nil
		}
		if _, err := update(ctx, cfg, metav1.UpdateOptions{}); err != nil {
			return err
		}
		klog.FromContext(ctx).Info("Patched caBundle", "kind", kind, "name", name)
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s %s: webhooks[].clientConfig.caBundle: %w", kind, name, err)
	}
	return nil
}

func setCABundle(cc *admissionregistrationv1.WebhookClientConfig, caBundle []byte) bool {
	if bytes.Equal(cc.CABundle, caBundle) {
		return false
	}
	cc.CABundle = bytes.Clone(caBundle)
	return true
}

// WriteFiles puts the serving certificate and key into dir as tls.crt and tls.key (what
// controller-runtime's webhook server and cert watcher read), each replaced atomically, and only
// when they differ. The key goes first: a watcher that sees the new key with the old certificate
// fails that one reload and succeeds on the next event.
func WriteFiles(dir string, b Bundle) (changed bool, err error) {
	if len(b.Cert) == 0 || len(b.Key) == 0 {
		return false, errors.New("write serving certificate: empty certificate or key")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, fmt.Errorf("cert dir %s: %w", dir, err)
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{TLSKeyKey, b.Key}, {TLSCertKey, b.Cert}, {CACertKey, b.CACert}} {
		path := filepath.Join(dir, f.name)
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, f.data) {
			continue
		}
		if err := writeAtomic(path, f.data); err != nil {
			return changed, err
		}
		changed = true
	}
	return changed, nil
}

// writeAtomic replaces path with a fsynced temp file from the same directory, so the watcher never
// reads half a PEM block and a crash keeps the old pair.
func writeAtomic(path string, data []byte) error {
	if err := renameio.WriteFile(path, data, 0o600, renameio.WithTempDir(filepath.Dir(path))); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
