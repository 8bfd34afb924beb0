package podinject

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/klog/v2"
)

// TemplateClient makes sure a managed ResourceClaimTemplate exists in its namespace.
type TemplateClient interface {
	// EnsureTemplate creates the template unless one with its name exists. An existing template
	// that the webhook does not manage, or whose spec is not this one, is a *RefusedError: pods
	// must not get someone else's devices.
	EnsureTemplate(ctx context.Context, template *resourceapi.ResourceClaimTemplate) error
}

// Validator is the validating webhook's judgement of a template, run on every template the
// handler would create.
type Validator interface {
	// ValidateTemplate returns warnings to pass on to the user, or an error that denies the pod.
	ValidateTemplate(ctx context.Context, template *resourceapi.ResourceClaimTemplate) (warnings []string, err error)
}

// APIClient writes templates through the API server, in the newest resource.k8s.io version it
// serves: the DRA client tries v1 first and falls back to v1beta2 and v1beta1, converting, so a
// 1.32 cluster gets v1beta1 objects and a cluster upgraded to 1.34 gets v1 ones from then on.
// It watches the managed templates (Run): a template is trusted only with the spec the webhook
// writes, and a namespace gets at most a bounded number of them.
type APIClient struct {
	templates func(namespace string) templateInterface
	managed   *managedTemplates
}

// templateInterface is the part of the typed client APIClient uses.
type templateInterface interface {
	Create(ctx context.Context, template *resourceapi.ResourceClaimTemplate, opts metav1.CreateOptions) (*resourceapi.ResourceClaimTemplate, error)
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*resourceapi.ResourceClaimTemplate, error)
}

// ClientOption configures an APIClient.
type ClientOption func(*clientOptions)

type clientOptions struct{ maxPerNamespace int }

// WithMaxTemplatesPerNamespace bounds the managed templates in one namespace (default
// DefaultMaxTemplatesPerNamespace); a pod that would need one more is denied.
func WithMaxTemplatesPerNamespace(n int) ClientOption {
	return func(o *clientOptions) { o.maxPerNamespace = n }
}

// NewAPIClient returns the TemplateClient of a real cluster; Run must be running for
// EnsureTemplate to answer. RBAC: resource.k8s.io resourceclaimtemplates get, list, watch, create.
func NewAPIClient(clientset kubernetes.Interface, opts ...ClientOption) *APIClient {
	o := clientOptions{maxPerNamespace: DefaultMaxTemplatesPerNamespace}
	for _, opt := range opts {
		opt(&o)
	}
	c := draclient.New(clientset)
	return &APIClient{
		templates: func(ns string) templateInterface { return c.ResourceClaimTemplates(ns) },
		managed:   newManagedTemplates(c, o.maxPerNamespace),
	}
}

// Run watches the managed templates until ctx ends.
func (c *APIClient) Run(ctx context.Context) { c.managed.run(ctx) }

// HasSynced reports whether the managed templates have been listed.
func (c *APIClient) HasSynced() bool { return c.managed.cache.HasSynced() }

// OnDelete calls f with every managed template deleted from the cluster (Handler.Forget).
func (c *APIClient) OnDelete(f func(namespace, name string)) { c.managed.onDelete(f) }

// RefusedError is an EnsureTemplate failure that no retry mends: the pod is denied with its
// message, which says what to change.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return e.Reason }

// errNotSynced is what EnsureTemplate answers before the managed templates are listed: neither
// what exists nor how many there are is known yet. Readiness waits for the list.
var errNotSynced = errors.New("managed ResourceClaimTemplates not listed yet; try again")

// EnsureTemplate looks in what the watch shows first: an existing template costs no request. A
// missing one is created within the namespace's bound; AlreadyExists (another replica, or a
// template the watch has not shown yet) is read back and checked like a watched one.
func (c *APIClient) EnsureTemplate(ctx context.Context, template *resourceapi.ResourceClaimTemplate) error {
	if !c.HasSynced() {
		return errNotSynced
	}
	if existing := c.managed.get(template.Namespace, template.Name); existing != nil {
		return checkSpec(existing.Spec, template)
	}
	release, err := c.managed.reserve(template.Namespace, template.Name)
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	templates := c.templates(template.Namespace)
	err = retry.OnError(createBackoff, transient, func() error {
		_, err := templates.Create(ctx, template, metav1.CreateOptions{})
		return err
	})
	if err == nil {
		logger.V(2).Info("Created managed ResourceClaimTemplate", "template", klog.KObj(template))
		return nil
	}
	release()
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ResourceClaimTemplate %s/%s: %w", template.Namespace, template.Name, err)
	}
	existing, err := templates.Get(ctx, template.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get existing ResourceClaimTemplate %s/%s: %w", template.Namespace, template.Name, err)
	}
	if existing.Labels[ManagedByLabel] != ManagedBy {
		return &RefusedError{Reason: fmt.Sprintf("ResourceClaimTemplate %s/%s exists but is not managed by %s (label %s=%s missing); delete or rename it",
			template.Namespace, template.Name, ManagedBy, ManagedByLabel, ManagedBy)}
	}
	// An unencodable spec keeps the zero digest, which no spec the webhook writes has.
	have, _ := specDigest(&existing.Spec)
	return checkSpec(have, template)
}

// checkSpec trusts an existing managed template only with the spec the webhook writes for its
// name. Anyone who may create templates in the namespace can create one under a managed name and
// label: with another spec it would capture every pod that asks for these GPUs. have is the
// existing template's specDigest: the informer keeps no more of it.
func checkSpec(have [sha256.Size]byte, want *resourceapi.ResourceClaimTemplate) error {
	if digest, err := specDigest(&want.Spec); err != nil || digest == have {
		return err
	}
	return &RefusedError{Reason: fmt.Sprintf("ResourceClaimTemplate %s/%s is labelled %s=%s but its spec is not the one the webhook writes for this request, so pods must not use it; delete it (kubectl -n %s delete resourceclaimtemplate %s) and the webhook creates it again",
		want.Namespace, want.Name, ManagedByLabel, ManagedBy, want.Namespace, want.Name)}
}

// createBackoff bounds the retries of a transient failure to about 1.5 s, well inside the
// webhook's timeout: long enough for kube-proxy to catch up after the API server restarted.
var createBackoff = wait.Backoff{Steps: 5, Duration: 50 * time.Millisecond, Factor: 2, Jitter: 0.1}

// transient errors go away on their own: a restarting single API server is briefly missing from
// the kubernetes Service (connection refused), the server sheds load, or it could not connect to
// the claim webhook it calls on the template (a replica going away while its endpoint is still
// listed; the next call reaches another).
func transient(err error) bool {
	return utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) ||
		apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err) ||
		webhookUnreachable(err)
}

// webhookUnreachable: the API server answered with an internal error because it could not connect
// to a webhook. The API server says so only in the message ("failed calling webhook …: connect:
// connection refused"); a webhook that answered, even slowly, is not retried.
func webhookUnreachable(err error) bool {
	if !apierrors.IsInternalError(err) {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "failed calling webhook") &&
		(strings.Contains(msg, "connection refused") || strings.Contains(msg, "connection reset by peer") || strings.Contains(msg, "no endpoints available"))
}
