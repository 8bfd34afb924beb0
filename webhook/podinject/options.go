package podinject

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
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
	// classes are the chart's DeviceClasses; the first serves the annotations.
	classes []DeviceClass
	// classOf maps each resource name a container may list in its limits (a class's extended
	// resource name and its implicit deviceclass.resource.kubernetes.io/<class>) to the class.
	classOf map[corev1.ResourceName]string
	cluster Cluster
	// podGroups, when set, lets pods of a PodGroup share the group's claim.
	podGroups PodGroups
}

// DeviceClass is one of the DeviceClasses the chart creates.
type DeviceClass struct {
	Name string
	// ExtendedResourceName, when set, is the class's spec.extendedResourceName: the resource
	// name pods may list in a container's resources.limits to get GPUs of the class.
	ExtendedResourceName corev1.ResourceName
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

// WithDeviceClasses sets the DeviceClasses pods get GPUs from (default: one named after the
// driver, without an extended resource name). The first is the class of the annotations.
func WithDeviceClasses(classes ...DeviceClass) Option {
	return func(o *options) { o.classes = classes }
}

// WithCluster tells the handler what the cluster serves (default: nothing optional, as a 1.32
// cluster with its default feature gates).
func WithCluster(c Cluster) Option { return func(o *options) { o.cluster = c } }

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
	if len(o.classes) == 0 {
		o.classes = []DeviceClass{{Name: o.driverName}}
	}
	o.classOf = map[corev1.ResourceName]string{}
	for _, c := range o.classes {
		if errs := validation.IsDNS1123Subdomain(c.Name); len(errs) > 0 {
			return o, fmt.Errorf("DeviceClass name %q: %v", c.Name, errs)
		}
		names := []corev1.ResourceName{corev1.ResourceName(resourceapi.ResourceDeviceClassPrefix + c.Name)}
		if c.ExtendedResourceName != "" {
			if err := ValidateExtendedResourceName(c.ExtendedResourceName); err != nil {
				return o, fmt.Errorf("DeviceClass %s: %w", c.Name, err)
			}
			names = append(names, c.ExtendedResourceName)
		}
		for _, n := range names {
			if other, ok := o.classOf[n]; ok {
				return o, fmt.Errorf("resource name %s names DeviceClasses %s and %s; a name can select one class only", n, other, c.Name)
			}
			o.classOf[n] = c.Name
		}
	}
	return o, nil
}

// countLimit is the largest count a pod may ask for: what a node holds, and never more than one
// claim can allocate.
func (o options) countLimit() int {
	return min(o.maxPerNode, resourceapi.AllocationResultsMaxSize)
}

func (o options) annotation(suffix string) string { return o.driverName + "/" + suffix }
