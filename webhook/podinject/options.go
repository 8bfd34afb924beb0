package podinject

import (
	"fmt"
	"time"

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
	// DefaultDriverName is the seed's driver name: annotation prefix, attribute domain and
	// DeviceClass name all at once.
	DefaultDriverName = "gpu.example.com"
	// DefaultCacheTTL is how long an ensured template is trusted to exist before the API server is
	// asked again; it bounds how long a deleted template stays missing.
	DefaultCacheTTL = time.Minute
)

// Annotation suffixes under the annotation prefix ("gpu.example.com/count" ...).
const (
	annCount      = "count"
	annModel      = "model"
	annMemory     = "memory"
	annContainers = "containers"
)

type options struct {
	driverName       string
	annotationPrefix string
	deviceClassName  string
	maxPerNode       int
	validator        Validator
	cacheTTL         time.Duration
}

// Option configures a Handler.
type Option func(*options)

// WithDriverName sets the driver whose devices are requested: the attribute and capacity domain
// the selectors name, and the default annotation prefix and DeviceClass name.
func WithDriverName(name string) Option { return func(o *options) { o.driverName = name } }

// WithAnnotationPrefix sets the prefix of the pod annotations (<prefix>/count, ...); default the
// driver name.
func WithAnnotationPrefix(prefix string) Option {
	return func(o *options) { o.annotationPrefix = prefix }
}

// WithDeviceClassName sets the DeviceClass of the injected request; default the driver name.
func WithDeviceClassName(name string) Option { return func(o *options) { o.deviceClassName = name } }

// WithMaxDevicesPerNode sets the most GPUs one pod may ask for, normally
// nodegroups.Config.MaxDevicesPerNode(): a pod asking for more could never be scheduled.
func WithMaxDevicesPerNode(n int) Option { return func(o *options) { o.maxPerNode = n } }

// WithValidator runs the template checks of the validating webhook on every template the handler
// would create, so an injected request can never be one the validating webhook rejects.
func WithValidator(v Validator) Option { return func(o *options) { o.validator = v } }

// WithCacheTTL sets how long ensured templates and validator verdicts are remembered; 0 turns the
// cache off (every pod asks the API server).
func WithCacheTTL(d time.Duration) Option { return func(o *options) { o.cacheTTL = d } }

func newOptions(opts []Option) (options, error) {
	o := options{driverName: DefaultDriverName, maxPerNode: deviceschema.DefaultCount, cacheTTL: DefaultCacheTTL}
	for _, opt := range opts {
		opt(&o)
	}
	if o.annotationPrefix == "" {
		o.annotationPrefix = o.driverName
	}
	if o.deviceClassName == "" {
		o.deviceClassName = o.driverName
	}
	if errs := validation.IsDNS1123Subdomain(o.driverName); len(errs) > 0 {
		return o, fmt.Errorf("driver name %q: %v", o.driverName, errs)
	}
	if errs := validation.IsQualifiedName(o.annotationPrefix + "/" + annContainers); len(errs) > 0 {
		return o, fmt.Errorf("annotation prefix %q: %v", o.annotationPrefix, errs)
	}
	if errs := validation.IsDNS1123Subdomain(o.deviceClassName); len(errs) > 0 {
		return o, fmt.Errorf("DeviceClass name %q: %v", o.deviceClassName, errs)
	}
	if o.maxPerNode < 1 {
		return o, fmt.Errorf("max devices per node %d: must be at least 1 (check the inventory config)", o.maxPerNode)
	}
	if o.cacheTTL < 0 {
		return o, fmt.Errorf("cache TTL %v: must not be negative", o.cacheTTL)
	}
	return o, nil
}

// countLimit is the largest count a pod may ask for: what a node holds, and never more than one
// claim can allocate.
func (o options) countLimit() int {
	return min(o.maxPerNode, resourceapi.AllocationResultsMaxSize)
}

func (o options) annotation(suffix string) string { return o.annotationPrefix + "/" + suffix }
