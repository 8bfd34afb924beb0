package podinject

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpu-dra/gpu-dra/internal/quantity"
)

// Cluster is what the handler needs to know about the cluster besides the pod.
type Cluster interface {
	// ServesExtendedResource reports whether the API server and the scheduler give a pod that
	// lists name in its limits devices of class themselves (KEP-5004, DRAExtendedResource).
	ServesExtendedResource(ctx context.Context, name corev1.ResourceName, class string) bool
	// DevicePluginNode returns a node that advertises name in its status.allocatable, as a
	// device plugin's resource, or "" for none.
	DevicePluginNode(name corev1.ResourceName) string
	// ServesPrioritizedList reports whether the API server keeps a request's firstAvailable.
	ServesPrioritizedList(ctx context.Context) (bool, error)
	// SharesMemory reports whether the API server keeps capacity requests (KEP-5075) and the
	// driver publishes GPUs several claims may share.
	SharesMemory(ctx context.Context) (bool, error)
}

// ValidateExtendedResourceName accepts what the API server accepts as a DeviceClass's
// spec.extendedResourceName and as a container's extended resource: <domain>/<name>, outside
// kubernetes.io, valid as a quota name (requests.<domain>/<name>).
func ValidateExtendedResourceName(name corev1.ResourceName) error {
	s := string(name)
	if !strings.Contains(s, "/") || strings.Contains(s, corev1.ResourceDefaultNamespacePrefix) || strings.HasPrefix(s, corev1.DefaultResourceRequestsPrefix) {
		return fmt.Errorf("extended resource name %q: want <domain>/<name> with a domain outside kubernetes.io, e.g. example.com/gpu", s)
	}
	if errs := validation.IsQualifiedName(corev1.DefaultResourceRequestsPrefix + s); len(errs) > 0 {
		return fmt.Errorf("extended resource name %q: %s", s, strings.Join(errs, "; "))
	}
	return nil
}

// extendedUse is one container's ask for GPUs through a resource name.
type extendedUse struct {
	// container numbers init containers first, then app containers, as the scheduler does.
	container int
	name      corev1.ResourceName
	class     string
	count     int64
	// longLived: an app container or a sidecar (an init container that keeps running).
	longLived bool
}

// extendedUses reads the GPU resources of every container that translate(name, class) accepts.
// A container's requests are what the scheduler counts; the API server copies limits into absent
// requests before admission, and the limits are read too for pods that reach the handler
// undefaulted. Every bad value is reported with its field and the fix.
func (o options) extendedUses(pod *podView, translate func(name corev1.ResourceName, class string) bool) ([]extendedUse, field.ErrorList) {
	var uses []extendedUse
	var errs field.ErrorList
	o.eachExtended(pod, func(path *field.Path, c containerView, number int, name corev1.ResourceName, class string) {
		if !translate(name, class) {
			return
		}
		n, err := o.extendedCount(path, c, name)
		if err != nil {
			errs = append(errs, err)
			return
		}
		longLived := number >= len(pod.Spec.InitContainers) || c.RestartPolicy == string(corev1.ContainerRestartPolicyAlways)
		uses = append(uses, extendedUse{container: number, name: name, class: class, count: n, longLived: longLived})
	})
	return uses, errs
}

// eachExtended calls fn once per container and resource name of a class, in limits or requests;
// number counts init containers first, then app containers. It allocates nothing for a pod
// without such names: every annotated pod passes through it.
func (o options) eachExtended(pod *podView, fn func(path *field.Path, c containerView, number int, name corev1.ResourceName, class string)) {
	inits := len(pod.Spec.InitContainers)
	visit := func(c containerView, number int) {
		if c.Resources == nil {
			return
		}
		for j, list := range []extendedQuantities{c.Resources.Limits, c.Resources.Requests} {
			for _, e := range list {
				class, ok := o.classOf[e.name]
				if !ok {
					continue
				}
				if _, inLimits := c.Resources.Limits.get(e.name); j == 1 && inLimits {
					continue
				}
				path := field.NewPath("spec", "initContainers").Index(number)
				if number >= inits {
					path = field.NewPath("spec", "containers").Index(number - inits)
				}
				fn(path, c, number, e.name, class)
			}
		}
	}
	for i, c := range pod.Spec.InitContainers {
		visit(c, i)
	}
	for i, c := range pod.Spec.Containers {
		visit(c, inits+i)
	}
}

// extendedCount is the number of GPUs container c asks for by name: 1..the most a node holds.
func (o options) extendedCount(path *field.Path, c containerView, name corev1.ResourceName) (int64, *field.Error) {
	limit, hasLimit := c.Resources.Limits.get(name)
	request, hasRequest := c.Resources.Requests.get(name)
	e, at := limit, path.Child("resources", "limits").Key(string(name))
	if !hasLimit {
		e, at = request, path.Child("resources", "requests").Key(string(name))
	}
	use := fmt.Sprintf("use a whole number of GPUs, 1..%d", o.countLimit())
	if hasLimit && hasRequest && limit.value != request.value {
		return 0, field.Invalid(path.Child("resources", "requests").Key(string(name)), shorten(request.value),
			fmt.Sprintf("differs from the limit %s; GPUs are counted, not shared: set the limit only", shorten(limit.value)))
	}
	q, err := quantity.Parse(strings.TrimSpace(e.value))
	switch {
	case !e.quantity || errors.Is(err, quantity.ErrSyntax):
		return 0, field.Invalid(at, shorten(e.value), "not a number of GPUs; "+use)
	case err != nil:
		return 0, field.Invalid(at, shorten(e.value), err.Error()+"; "+use)
	case q.Sign() < 0:
		return 0, field.Invalid(at, shorten(e.value), "negative; "+use)
	case q.Sign() == 0:
		return 0, field.Invalid(at, shorten(e.value), fmt.Sprintf("0 GPUs; remove %s from the container's resources, or %s", name, use))
	case q.CmpInt64(int64(o.maxPerNode)) > 0:
		return 0, field.Invalid(at, shorten(e.value), fmt.Sprintf("more than any node of driver %s has (%d); %s", o.driverName, o.maxPerNode, use))
	case q.CmpInt64(int64(o.countLimit())) > 0:
		return 0, field.Invalid(at, shorten(e.value), fmt.Sprintf("more than one claim can allocate (%d); %s", resourceapi.AllocationResultsMaxSize, use))
	}
	n, whole := q.AsInt64()
	if !whole {
		return 0, field.Invalid(at, shorten(e.value), "not a whole number of GPUs; "+use)
	}
	return n, nil
}

// extendedWithAnnotation denies a pod that asks for GPUs both ways: the two would be allocated
// separately, twice the GPUs the user meant.
func (o options) extendedWithAnnotation(pod *podView) field.ErrorList {
	var errs field.ErrorList
	o.eachExtended(pod, func(path *field.Path, c containerView, _ int, name corev1.ResourceName, _ string) {
		list := "limits"
		if _, ok := c.Resources.Limits.get(name); !ok {
			list = "requests"
		}
		errs = append(errs, field.Forbidden(path.Child("resources", list).Key(string(name)), fmt.Sprintf(
			"the pod also asks for GPUs with the annotation %s, and would get both; ask one way: remove %s or the annotation", o.annotation(annCount), name)))
	})
	return errs
}

// extendedPlan is what translating a pod's GPU resources takes: the managed template's requests,
// the requests each container references, and the resources taken out of the pod.
type extendedPlan struct {
	requests []resourceapi.DeviceRequest
	// byContainer are the request names each container (init containers first) references.
	byContainer map[int][]string
	uses        []extendedUse
	// namesOf are the resource names of each container's uses, sorted: j in the request names.
	namesOf map[int][]corev1.ResourceName
}

// planExtended turns uses into one claim's requests as the scheduler does for the claims it makes
// itself (so a pod's request names are the same whichever serves it): per resource name, every
// long-lived container gets a request of its own, named container-<i>-request-<j>; an init
// container that runs to completion first borrows the devices of long-lived containers that start
// after it, asks only for what they lack, and all such init containers share the largest of those
// requests, since they run one after another. Here j numbers a container's resource names that
// have a domain, in order.
func planExtended(uses []extendedUse) extendedPlan {
	p := extendedPlan{byContainer: map[int][]string{}, uses: uses, namesOf: map[int][]corev1.ResourceName{}}
	names := map[corev1.ResourceName]bool{}
	for _, u := range uses {
		names[u.name] = true
		p.namesOf[u.container] = append(p.namesOf[u.container], u.name)
	}
	for _, n := range p.namesOf {
		slices.Sort(n)
	}
	for _, name := range slices.Sorted(mapsKeys(names)) {
		own := map[int]*resourceapi.DeviceRequest{} // long-lived container -> its request
		for _, u := range uses {
			if u.name == name && u.longLived {
				r := p.request(u, u.count)
				own[u.container] = &r
				p.requests = append(p.requests, r)
				p.byContainer[u.container] = append(p.byContainer[u.container], r.Name)
			}
		}
		var shared *resourceapi.DeviceRequest
		var sharers []int
		for _, u := range uses {
			if u.name != name || u.longLived {
				continue
			}
			need := u.count
			for _, c := range slices.Sorted(mapsKeys(own)) {
				if c < u.container || need <= 0 {
					continue
				}
				need -= own[c].Exactly.Count
				p.byContainer[u.container] = append(p.byContainer[u.container], own[c].Name)
			}
			if need > 0 {
				sharers = append(sharers, u.container)
				if shared == nil || shared.Exactly.Count < need {
					r := p.request(u, need)
					shared = &r
				}
			}
		}
		if shared != nil {
			p.requests = append(p.requests, *shared)
			for _, c := range sharers {
				p.byContainer[c] = append(p.byContainer[c], shared.Name)
			}
		}
	}
	slices.SortFunc(p.requests, func(a, b resourceapi.DeviceRequest) int { return strings.Compare(a.Name, b.Name) })
	return p
}

// total is how many GPUs the requests hold together.
func (p extendedPlan) total() int64 {
	var n int64
	for _, r := range p.requests {
		n += r.Exactly.Count
	}
	return n
}

// request is u's own request for count devices.
func (p extendedPlan) request(u extendedUse, count int64) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{
		Name: fmt.Sprintf("container-%d-request-%d", u.container, slices.Index(p.namesOf[u.container], u.name)),
		Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: u.class,
			AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
			Count:           count,
		},
	}
}

func mapsKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// handleExtended serves a pod without the count annotation whose containers list a class's
// resource name in their limits, once handle has checked its namespace and deadline. Where the cluster serves the name itself (KEP-5004) the
// pod passes untouched; elsewhere the names become a claim from a managed template, as the
// annotation's do, and leave the pod's resources (else the scheduler would look for a node that
// advertises them, and find none).
func (h *Handler) handleExtended(ctx context.Context, namespace string, dryRun *bool, pod *podView) admission.Response {
	logger := klog.FromContext(ctx)

	var warnings []string
	decided := map[corev1.ResourceName]bool{}
	translate := func(name corev1.ResourceName, class string) bool {
		if t, ok := decided[name]; ok {
			return t
		}
		t := true
		if h.opts.cluster != nil && h.opts.cluster.ServesExtendedResource(ctx, name, class) {
			t = false
		} else if node := h.devicePluginNode(name); node != "" {
			warnings = append(warnings, fmt.Sprintf("node %s advertises %s through a device plugin: this pod gets its %s from the device plugin, not from DeviceClass %s", node, name, name, class))
			t = false
		}
		decided[name] = t
		return t
	}
	uses, errs := h.opts.extendedUses(pod, translate)
	if len(errs) > 0 {
		return denied(pod, errs).WithWarnings(warnings...)
	}
	if len(uses) == 0 {
		return admission.Allowed("the cluster serves these extended resources itself").WithWarnings(warnings...)
	}
	// Long-lived containers hold their GPUs together: more than a node has is refused before
	// planning, whose work grows with the containers a forged pod may list by the thousand.
	if errs := h.opts.checkTotal(longLivedTotal(uses)); len(errs) > 0 {
		return denied(pod, errs).WithWarnings(warnings...)
	}
	p := planExtended(uses)
	if errs := h.opts.checkExtendedPlan(pod, p); len(errs) > 0 {
		return denied(pod, errs).WithWarnings(warnings...)
	}
	template, err := h.opts.managedTemplate(namespace, int(p.total()), p.requests)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if resp, gone := expired(ctx); gone {
		return resp.WithWarnings(warnings...)
	}
	more, err := h.validate(ctx, template)
	if err != nil {
		return admission.Denied(fmt.Sprintf("the GPUs the containers' resources ask for are not a valid request: %v", err)).WithWarnings(warnings...)
	}
	warnings = append(warnings, more...)
	if resp, failed := h.ensureUnlessDryRun(ctx, dryRun, template); failed {
		return resp.WithWarnings(warnings...)
	}
	logger.V(3).Info("Turning extended resources into a GPU claim", "template", klog.KObj(template), "requests", len(p.requests))
	return admission.Patched("turned the containers' GPU resources into a claim", p.patch(pod, template.Name)...).WithWarnings(warnings...)
}

func (h *Handler) devicePluginNode(name corev1.ResourceName) string {
	if h.opts.cluster == nil {
		return ""
	}
	return h.opts.cluster.DevicePluginNode(name)
}

// hasExtended: some container lists one of the classes' resource names.
func (o options) hasExtended(pod *podView) bool {
	has := false
	o.eachExtended(pod, func(*field.Path, containerView, int, corev1.ResourceName, string) { has = true })
	return has
}

// checkExtendedPlan denies what one claim cannot hold, and a pod that already uses the claim name
// the webhook adds.
func (o options) checkExtendedPlan(pod *podView, p extendedPlan) field.ErrorList {
	var errs field.ErrorList
	for i, rc := range pod.Spec.ResourceClaims {
		if rc.Name == ClaimName {
			errs = append(errs, field.Invalid(field.NewPath("spec", "resourceClaims").Index(i).Child("name"), rc.Name, fmt.Sprintf(
				"the claim name %q is reserved for the GPUs the containers' resources ask for; rename this entry and its container references", ClaimName)))
		}
	}
	if len(p.requests) > resourceapi.DeviceRequestsMaxSize {
		return append(errs, field.TooMany(field.NewPath("spec", "containers"), len(p.requests), resourceapi.DeviceRequestsMaxSize))
	}
	return append(errs, o.checkTotal(p.total())...)
}

// checkTotal refuses more GPUs for one pod than one node holds.
func (o options) checkTotal(total int64) field.ErrorList {
	if total <= int64(o.countLimit()) {
		return nil
	}
	return field.ErrorList{field.Invalid(field.NewPath("spec", "containers"), total, fmt.Sprintf(
		"the containers ask for %d GPUs together, and a pod's GPUs come from one node, where at most %d are; ask for fewer, or split the work across pods", total, o.countLimit()))}
}

// longLivedTotal is what the long-lived containers ask for together, the least the claim holds.
func longLivedTotal(uses []extendedUse) int64 {
	var n int64
	for _, u := range uses {
		if u.longLived {
			n += u.count
		}
	}
	return n
}

// patch adds the claim, references each container's requests, and removes the resources the
// claim replaces (the pod's own claims and other resources stay as they are).
func (p extendedPlan) patch(pod *podView, templateName string) []jsonpatch.JsonPatchOperation {
	entry := corev1.PodResourceClaim{Name: ClaimName, ResourceClaimTemplateName: &templateName}
	var ops []jsonpatch.JsonPatchOperation
	if len(pod.Spec.ResourceClaims) == 0 {
		ops = append(ops, jsonpatch.NewOperation("add", "/spec/resourceClaims", []corev1.PodResourceClaim{entry}))
	} else {
		ops = append(ops, jsonpatch.NewOperation("add", "/spec/resourceClaims/-", entry))
	}
	inits := len(pod.Spec.InitContainers)
	for _, number := range slices.Sorted(mapsKeys(p.namesOf)) {
		c, path := pod.Spec.InitContainers, fmt.Sprintf("/spec/initContainers/%d/resources", number)
		i := number
		if number >= inits {
			c, path, i = pod.Spec.Containers, fmt.Sprintf("/spec/containers/%d/resources", number-inits), number-inits
		}
		for _, name := range p.namesOf[number] {
			if _, ok := c[i].Resources.Limits.get(name); ok {
				ops = append(ops, jsonpatch.NewOperation("remove", path+"/limits/"+escapePointer(string(name)), nil))
			}
			if _, ok := c[i].Resources.Requests.get(name); ok {
				ops = append(ops, jsonpatch.NewOperation("remove", path+"/requests/"+escapePointer(string(name)), nil))
			}
		}
		refs := p.byContainer[number]
		for j, request := range refs {
			ref := corev1.ResourceClaim{Name: ClaimName, Request: request}
			if j == 0 && len(c[i].claims()) == 0 {
				ops = append(ops, jsonpatch.NewOperation("add", path+"/claims", []corev1.ResourceClaim{ref}))
				continue
			}
			ops = append(ops, jsonpatch.NewOperation("add", path+"/claims/-", ref))
		}
	}
	return ops
}

// escapePointer escapes a JSON pointer token (RFC 6901).
func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
