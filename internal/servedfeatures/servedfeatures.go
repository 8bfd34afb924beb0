// Package servedfeatures tells which optional resource.k8s.io features the cluster's API server
// serves. A feature gate that is off makes the API server drop its fields silently on write, while
// discovery and OpenAPI list them either way, and the version string says nothing about gates. So
// the answers come from round trips: a ResourceClaimTemplate created with dryRun (nothing is
// stored) and compared with what came back, or objects the product wrote read back from an
// informer. Answers are cached, and Run asks again periodically so that a control-plane upgrade is
// followed without a restart; each answer is logged once, when it is first found or changes.
package servedfeatures

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// Feature names a feature by the Kubernetes feature gate that serves it.
type Feature string

// The features this package detects.
const (
	// PrioritizedList: a request's firstAvailable subrequests (KEP-4816).
	PrioritizedList Feature = "DRAPrioritizedList"
	// AdminAccess: a request's adminAccess (KEP-5018).
	AdminAccess Feature = "DRAAdminAccess"
	// ExtendedResource: DeviceClass spec.extendedResourceName, pods' resources.limits served
	// through DRA (KEP-5004).
	ExtendedResource Feature = "DRAExtendedResource"
	// ConsumableCapacity: devices allocated to several claims at once, each consuming a share of
	// their capacity (allowMultipleAllocations, requestPolicy, a request's capacity; KEP-5075).
	ConsumableCapacity Feature = "DRAConsumableCapacity"
	// PartitionableDevices: devices consuming counters that slices share (KEP-4815).
	PartitionableDevices Feature = "DRAPartitionableDevices"
)

// AdminAccessSupport is what the API server does with a request's adminAccess.
type AdminAccessSupport int

const (
	// AdminAccessDropped: the field is dropped on write (1.32 and 1.33 by default).
	AdminAccessDropped AdminAccessSupport = iota
	// AdminAccessServed: the field is kept; whether the namespace label is required is unknown
	// (1.32 with the alpha gate on has no label check; the probe namespace may carry the label).
	AdminAccessServed
	// AdminAccessNeedsLabel: the field is kept, and only in namespaces labelled
	// resource.kubernetes.io/admin-access=true (1.33+ with the gate on).
	AdminAccessNeedsLabel
)

func (s AdminAccessSupport) String() string {
	switch s {
	case AdminAccessServed:
		return "served"
	case AdminAccessNeedsLabel:
		return "served in namespaces labelled " + resourceapi.DRAAdminNamespaceLabelKey + "=true"
	default:
		return "dropped"
	}
}

// templateCreator is the part of a ResourceClaimTemplate client the probes use.
type templateCreator interface {
	Create(ctx context.Context, template *resourceapi.ResourceClaimTemplate, opts metav1.CreateOptions) (*resourceapi.ResourceClaimTemplate, error)
}

// Detector detects and caches. It is safe for concurrent use.
type Detector struct {
	templates templateCreator
	namespace string
	fallbacks map[Feature]string
	ttl       time.Duration
	errorTTL  time.Duration
	clock     clock.PassiveClock
	// classes, when set, lists the stored DeviceClasses for Refresh (ExtendedResources).
	classes func() []*resourceapi.DeviceClass

	inflight singleflight.Group
	mu       sync.Mutex
	answers  map[Feature]answer
	// logged is the last answer logged per feature, so each change is logged once.
	logged map[Feature]string
}

type answer struct {
	value   any
	err     error
	expires time.Time
}

// Option configures a Detector.
type Option func(*Detector)

// WithFallback says what the caller does while f is not served; it goes into the one log line
// that reports it.
func WithFallback(f Feature, what string) Option {
	return func(d *Detector) { d.fallbacks[f] = what }
}

// WithTTL sets how long an answer is trusted before the API server is asked again (default
// 10 minutes): gates change only when the API server restarts, and Run asks sooner.
func WithTTL(ttl time.Duration) Option { return func(d *Detector) { d.ttl = ttl } }

// WithStoredClasses gives Refresh the stored DeviceClasses (an informer's), so that it re-reads
// ExtendedResources with the other features rather than only when a request asks.
func WithStoredClasses(list func() []*resourceapi.DeviceClass) Option {
	return func(d *Detector) { d.classes = list }
}

// WithClock replaces the real clock, for tests.
func WithClock(c clock.PassiveClock) Option { return func(d *Detector) { d.clock = c } }

// New returns a Detector that probes with dry-run ResourceClaimTemplates in namespace, in the
// newest resource.k8s.io version the cluster serves (the DRA client converts). namespace should be
// one no admission webhook of the product judges (the chart's release namespace). RBAC:
// resource.k8s.io resourceclaimtemplates create in namespace.
func New(cs kubernetes.Interface, namespace string, opts ...Option) *Detector {
	return newDetector(draclient.New(cs).ResourceClaimTemplates(namespace), namespace, opts...)
}

func newDetector(templates templateCreator, namespace string, opts ...Option) *Detector {
	d := &Detector{
		templates: templates,
		namespace: namespace,
		fallbacks: map[Feature]string{},
		ttl:       10 * time.Minute,
		errorTTL:  5 * time.Second,
		clock:     clock.RealClock{},
		answers:   map[Feature]answer{},
		logged:    map[Feature]string{},
	}
	for _, o := range opts {
		o(d)
	}
	return d
}

// PrioritizedList reports whether the API server keeps a request's firstAvailable.
func (d *Detector) PrioritizedList(ctx context.Context) (bool, error) {
	v, err := d.cached(ctx, PrioritizedList, d.probePrioritizedList)
	if err != nil {
		return false, err
	}
	return v.(bool), nil
}

// AdminAccess reports what the API server does with a request's adminAccess.
func (d *Detector) AdminAccess(ctx context.Context) (AdminAccessSupport, error) {
	v, err := d.cached(ctx, AdminAccess, d.probeAdminAccess)
	if err != nil {
		return AdminAccessDropped, err
	}
	return v.(AdminAccessSupport), nil
}

// ExtendedResources reports whether the API server keeps DeviceClass spec.extendedResourceName,
// read back from the classes it stored (e.g. an informer's): a class that has the field was stored
// with the gate on. Without any such class the answer is false, which is also right for the
// caller: with no class naming an extended resource, no pod's limits are served through DRA by
// an explicit name.
func (d *Detector) ExtendedResources(ctx context.Context, classes []*resourceapi.DeviceClass) bool {
	served := false
	for _, c := range classes {
		if ptr.Deref(c.Spec.ExtendedResourceName, "") != "" {
			served = true
			break
		}
	}
	d.report(ctx, ExtendedResource, served, "no stored DeviceClass has spec.extendedResourceName")
	return served
}

// ConsumableCapacity reports whether the API server keeps a request's capacity requests (and with
// them the rest of KEP-5075: a device's allowMultipleAllocations and requestPolicy are behind the
// same gate).
func (d *Detector) ConsumableCapacity(ctx context.Context) (bool, error) {
	v, err := d.cached(ctx, ConsumableCapacity, d.probeConsumableCapacity)
	if err != nil {
		return false, err
	}
	return v.(bool), nil
}

// PartitionableDevices reports whether the API server keeps partitionable devices, read back from
// the slices it stored (e.g. an informer's): a slice with shared counters, or a device consuming
// them, was stored with the gate on. Without any the answer is false, which is also right for the
// caller: where nothing consumes counters, no allocation depends on them. A claim has no field of
// the feature to probe with, and creating slices is the drivers' right, not a webhook's.
func (d *Detector) PartitionableDevices(ctx context.Context, slices []*resourceapi.ResourceSlice) bool {
	served := false
	for _, s := range slices {
		if len(s.Spec.SharedCounters) > 0 {
			served = true
			break
		}
		for i := range s.Spec.Devices {
			if len(s.Spec.Devices[i].ConsumesCounters) > 0 {
				served = true
				break
			}
		}
		if served {
			break
		}
	}
	d.report(ctx, PartitionableDevices, served, "no stored ResourceSlice has sharedCounters or consumesCounters")
	return served
}

// Warm runs the probes once, so that the first request that needs an answer finds it cached;
// failures are logged and retried on first use.
func (d *Detector) Warm(ctx context.Context) {
	if _, err := d.PrioritizedList(ctx); err != nil {
		klog.FromContext(ctx).Info("Probing the API server's features failed; retrying on first use", "feature", PrioritizedList, "err", err)
	}
	if _, err := d.AdminAccess(ctx); err != nil {
		klog.FromContext(ctx).Info("Probing the API server's features failed; retrying on first use", "feature", AdminAccess, "err", err)
	}
	if _, err := d.ConsumableCapacity(ctx); err != nil {
		klog.FromContext(ctx).Info("Probing the API server's features failed; retrying on first use", "feature", ConsumableCapacity, "err", err)
	}
}

// probes are the features answered by a dry-run probe, with what asks each.
func (d *Detector) probes() map[Feature]func(context.Context) (any, error) {
	return map[Feature]func(context.Context) (any, error){
		PrioritizedList:    d.probePrioritizedList,
		AdminAccess:        d.probeAdminAccess,
		ConsumableCapacity: d.probeConsumableCapacity,
	}
}

// Refresh asks the API server again about every probed feature, whatever the cache holds, and
// re-reads the stored classes (WithStoredClasses); a change is logged once. A failure keeps the
// last answer while its TTL lasts.
func (d *Detector) Refresh(ctx context.Context) {
	for f, probe := range d.probes() {
		if _, err := d.probe(ctx, f, probe); err != nil {
			klog.FromContext(ctx).V(2).Info("Re-probing the API server's features failed", "feature", f, "err", err)
		}
	}
	if d.classes != nil {
		if classes := d.classes(); classes != nil {
			d.ExtendedResources(ctx, classes)
		}
	}
}

// RefreshJitter spreads the re-probes of a fleet's webhooks: each waits interval times 1 to 1.2.
const RefreshJitter = 0.2

// Run calls Refresh every interval (jittered) until ctx ends, so that the features a
// control-plane upgrade turns on are picked up within about interval, with or without requests.
func (d *Detector) Run(ctx context.Context, interval time.Duration) {
	wait.JitterUntilWithContext(ctx, d.Refresh, interval, RefreshJitter, false)
}

// cached returns the answer for f, probing at most once at a time. Errors are remembered briefly
// so that an unreachable API server is not probed once per admission request; nothing computed
// under a cancelled context is remembered.
func (d *Detector) cached(ctx context.Context, f Feature, probe func(context.Context) (any, error)) (any, error) {
	d.mu.Lock()
	a, ok := d.answers[f]
	d.mu.Unlock()
	if ok && d.clock.Now().Before(a.expires) {
		return a.value, a.err
	}
	return d.probe(ctx, f, probe)
}

// probe asks the API server about f and caches the answer, at most one probe of f at a time.
func (d *Detector) probe(ctx context.Context, f Feature, probe func(context.Context) (any, error)) (any, error) {
	v, err, _ := d.inflight.Do(string(f), func() (any, error) {
		v, err := probe(ctx)
		if ctx.Err() != nil {
			return v, err
		}
		ttl := d.ttl
		if err != nil {
			ttl = d.errorTTL
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		// A failed Refresh does not replace an answer still within its TTL.
		if prev, ok := d.answers[f]; err != nil && ok && prev.err == nil && d.clock.Now().Before(prev.expires) {
			return prev.value, nil
		}
		d.answers[f] = answer{value: v, err: err, expires: d.clock.Now().Add(ttl)}
		return v, err
	})
	return v, err
}

// report logs the answer for f when it differs from the last one logged: once at the first answer,
// and again only if the cluster changed (an upgrade, a restarted API server with other gates).
func (d *Detector) report(ctx context.Context, f Feature, served bool, evidence string) {
	state := "served"
	if !served {
		state = "not served"
	}
	d.mu.Lock()
	before, seen := d.logged[f]
	d.logged[f] = state
	d.mu.Unlock()
	if before == state {
		return
	}
	logger := klog.FromContext(ctx)
	switch {
	case served && seen:
		logger.Info("The API server now serves a DRA feature", "feature", f)
	case served:
		logger.Info("The API server serves a DRA feature", "feature", f)
	case seen:
		logger.Info("The API server no longer serves a DRA feature; falling back", "feature", f, "evidence", evidence, "fallback", d.fallbacks[f])
	default:
		logger.Info("The API server does not serve a DRA feature; falling back", "feature", f, "evidence", evidence, "fallback", d.fallbacks[f])
	}
}

// probeTemplate is a template whose one request is valid only as long as the API server keeps the
// field under test.
func (d *Detector) probeTemplate(name string, request resourceapi.DeviceRequest) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.namespace},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{
			Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{request}},
		}},
	}
}

// dryRun creates t without storing it. Unknown fields are ignored rather than refused, so that a
// server whose schema lacks the field answers like one whose gate is off: it drops it.
func (d *Detector) dryRun(ctx context.Context, t *resourceapi.ResourceClaimTemplate) (*resourceapi.ResourceClaimTemplate, error) {
	return d.templates.Create(ctx, t, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationIgnore})
}

const probeClass = "servedfeatures.probe"

func (d *Detector) probePrioritizedList(ctx context.Context) (any, error) {
	t := d.probeTemplate("servedfeatures-prioritized-list", resourceapi.DeviceRequest{
		Name: "probe",
		FirstAvailable: []resourceapi.DeviceSubRequest{{
			Name: "only", DeviceClassName: probeClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		}},
	})
	got, err := d.dryRun(ctx, t)
	served := false
	switch {
	case apierrors.IsInvalid(err):
		// Without firstAvailable the request names no device class: the field was dropped.
	case err != nil:
		return false, fmt.Errorf("dry-run ResourceClaimTemplate %s/%s with firstAvailable: %w", d.namespace, t.Name, err)
	default:
		served = len(got.Spec.Spec.Devices.Requests) == 1 && len(got.Spec.Spec.Devices.Requests[0].FirstAvailable) == 1
	}
	d.report(ctx, PrioritizedList, served, "a dry-run ResourceClaimTemplate lost spec.devices.requests[].firstAvailable")
	return served, nil
}

func (d *Detector) probeAdminAccess(ctx context.Context) (any, error) {
	t := d.probeTemplate("servedfeatures-admin-access", resourceapi.DeviceRequest{
		Name: "probe",
		Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: probeClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			AdminAccess: ptr.To(true),
		},
	})
	got, err := d.dryRun(ctx, t)
	var support AdminAccessSupport
	switch {
	case refusesAdminAccess(err):
		support = AdminAccessNeedsLabel
	case err != nil:
		return AdminAccessDropped, fmt.Errorf("dry-run ResourceClaimTemplate %s/%s with adminAccess: %w", d.namespace, t.Name, err)
	case len(got.Spec.Spec.Devices.Requests) == 1 && got.Spec.Spec.Devices.Requests[0].Exactly != nil &&
		ptr.Deref(got.Spec.Spec.Devices.Requests[0].Exactly.AdminAccess, false):
		support = AdminAccessServed
	}
	d.report(ctx, AdminAccess, support != AdminAccessDropped, "a dry-run ResourceClaimTemplate lost spec.devices.requests[].exactly.adminAccess")
	return support, nil
}

func (d *Detector) probeConsumableCapacity(ctx context.Context) (any, error) {
	one := resource.MustParse("1Gi")
	t := d.probeTemplate("servedfeatures-consumable-capacity", resourceapi.DeviceRequest{
		Name: "probe",
		Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: probeClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": one}},
		},
	})
	got, err := d.dryRun(ctx, t)
	if err != nil {
		return false, fmt.Errorf("dry-run ResourceClaimTemplate %s/%s with capacity requests: %w", d.namespace, t.Name, err)
	}
	served := len(got.Spec.Spec.Devices.Requests) == 1 && got.Spec.Spec.Devices.Requests[0].Exactly != nil &&
		got.Spec.Spec.Devices.Requests[0].Exactly.Capacity != nil && len(got.Spec.Spec.Devices.Requests[0].Exactly.Capacity.Requests) == 1
	d.report(ctx, ConsumableCapacity, served, "a dry-run ResourceClaimTemplate lost spec.devices.requests[].exactly.capacity")
	return served, nil
}

// refusesAdminAccess: the API server's own namespace check refused the request's adminAccess
// ("admin access to devices requires the `resource.kubernetes.io/admin-access: true` label on the
// containing namespace"), which it does only where the field is served.
func refusesAdminAccess(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	for _, c := range status.Status().Details.Causes {
		if c.Type == metav1.CauseType(field.ErrorTypeForbidden) && strings.HasSuffix(c.Field, "adminAccess") {
			return true
		}
	}
	return false
}
