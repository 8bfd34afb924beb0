package podinject

import (
	"context"
	"fmt"
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
	// that the webhook does not manage is an error: pods must not get someone else's devices.
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
type APIClient struct {
	templates func(namespace string) templateInterface
}

// templateInterface is the part of the typed client APIClient uses.
type templateInterface interface {
	Create(ctx context.Context, template *resourceapi.ResourceClaimTemplate, opts metav1.CreateOptions) (*resourceapi.ResourceClaimTemplate, error)
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*resourceapi.ResourceClaimTemplate, error)
}

// NewAPIClient returns the TemplateClient of a real cluster. RBAC: resource.k8s.io
// resourceclaimtemplates get and create.
func NewAPIClient(clientset kubernetes.Interface) *APIClient {
	c := draclient.New(clientset)
	return &APIClient{templates: func(ns string) templateInterface { return c.ResourceClaimTemplates(ns) }}
}

// EnsureTemplate creates first and looks only on conflict: the common case of a template that
// exists costs one request either way, and a missing one costs no failed Get (which the DRA client
// would retry in every API version).
func (c *APIClient) EnsureTemplate(ctx context.Context, template *resourceapi.ResourceClaimTemplate) error {
	logger := klog.FromContext(ctx)
	templates := c.templates(template.Namespace)
	err := retry.OnError(createBackoff, transient, func() error {
		_, err := templates.Create(ctx, template, metav1.CreateOptions{})
		return err
	})
	if err == nil {
		logger.V(2).Info("Created managed ResourceClaimTemplate", "template", klog.KObj(template))
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ResourceClaimTemplate %s/%s: %w", template.Namespace, template.Name, err)
	}
	existing, err := templates.Get(ctx, template.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get existing ResourceClaimTemplate %s/%s: %w", template.Namespace, template.Name, err)
	}
	if existing.Labels[ManagedByLabel] != ManagedBy {
		return fmt.Errorf("ResourceClaimTemplate %s/%s exists but is not managed by %s (label %s=%s missing); delete or rename it",
			template.Namespace, template.Name, ManagedBy, ManagedByLabel, ManagedBy)
	}
	return nil
}

// createBackoff bounds the retries of a transient failure to about 1.5 s, well inside the
// webhook's timeout: long enough for kube-proxy to catch up after the API server restarted.
var createBackoff = wait.Backoff{Steps: 5, Duration: 50 * time.Millisecond, Factor: 2, Jitter: 0.1}

// transient errors go away on their own: a restarting single API server is briefly missing from
// the kubernetes Service (connection refused), or the server sheds load.
func transient(err error) bool {
	return utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) ||
		apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err)
}
