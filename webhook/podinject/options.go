package podinject

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

// Names the webhook owns in a pod and in the managed templates.
const (
	// Path is where the handler is served; the chart's MutatingWebhookConfiguration points here.
	Path = "/mutate-pod"
	// ClaimName is the spec.resourceClaims entry the webhook adds. Users' own entries use other
	// names; one that takes this name for something else is denied rather than overwritten.
	ClaimName = "gpu-dra"
	// RequestName is the one request of every managed template.
	RequestName = "gpus"
	// ManagedBy is the app.kubernetes.io/managed-by label value of managed templates.
	ManagedBy = "gpu-dra"
	// ManagedByLabel marks templates the webhook created, so cleanup and humans can find them.
	ManagedByLabel = "app.kubernetes.io/managed-by"
)

// Annotation suffixes under the annotation prefix ("gpu.example.com/count" ...).
const (
	annCount      = "count"
	annModel      = "model"
	annMemory     = "memory"
	annContainers = "containers"
)

type options struct {
	driverName string
	maxPerNode int
	validator  Validator
	excluded   []string
}

// Option configures a Handler.
type Option func(*options)

// WithDriverName sets the driver whose devices are requested (default
// deviceschema.DefaultDriverName): the attribute and capacity domain the selectors name, the
// prefix of the pod annotations (<driver>/count, ...) and the DeviceClass the chart creates.
func WithDriverName(name string) Option { return func(o *options) { o.driverName = name } }

// WithMaxDevicesPerNode sets the most GPUs one pod may ask for, normally
// nodegroups.Config.MaxDevicesPerNode(): a pod asking for more could never be scheduled.
func WithMaxDevicesPerNode(n int) Option { return func(o *options) { o.maxPerNode = n } }

// WithValidator runs the template checks of the validating webhook on every template the handler
// would create, so an injected request can never be one the validating webhook rejects.
func WithValidator(v Validator) Option { return func(o *options) { o.validator = v } }

// WithExcludedNamespaces names the namespaces the webhook configuration's namespaceSelector
// excludes (the chart: kube-system and its own). The API server never sends their pods, so a review
// naming one was posted by someone else, straight to the Service: it is denied before anything,
// a template least of all, is created there.
func WithExcludedNamespaces(namespaces ...string) Option {
	return func(o *options) { o.excluded = append(o.excluded, namespaces...) }
}

func newOptions(opts []Option) (options, error) {
	o := options{driverName: deviceschema.DefaultDriverName, maxPerNode: deviceschema.DefaultCount}
	for _, opt := range opts {
		opt(&o)
	}
	// A DNS subdomain is also a valid annotation prefix and DeviceClass name.
	if errs := validation.IsDNS1123Subdomain(o.driverName); len(errs) > 0 {
		return o, fmt.Errorf("driver name %q: %v", o.driverName, errs)
	}
	if o.maxPerNode < 1 {
		return o, fmt.Errorf("max devices per node %d: must be at least 1 (check the inventory config)", o.maxPerNode)
	}
	return o, nil
}

// countLimit is the largest count a pod may ask for: what a node holds, and never more than one
// claim can allocate.
func (o options) countLimit() int {
	return min(o.maxPerNode, resourceapi.AllocationResultsMaxSize)
}

func (o options) annotation(suffix string) string { return o.driverName + "/" + suffix }
