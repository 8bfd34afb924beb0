// Package podinject is the mutating admission handler that gives a pod GPUs from one annotation:
// `gpu.example.com/count: "2"` becomes a spec.resourceClaims entry pointing at a managed
// ResourceClaimTemplate, and a resources.claims reference in each chosen container.
package podinject

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/singleflight"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpu-dra/gpu-dra/webhook/denial"
)

// Handler is the admission.Handler for pod CREATE; register it at /mutate-pod.
type Handler struct {
	opts   options
	client TemplateClient
	// The caches remember recent successes so a burst of pods costs the API server one request,
	// not one per pod: ensured templates by namespace/name, the validator's warnings by template
	// name, and built templates by request without namespace (building one hashes its spec, a
	// fifth of the handler's time).
	ensured, verdicts, templates *cache.LRUExpireCache
	inflight                     singleflight.Group
	// sharedTimeout bounds work shared by concurrent reviews (maxReviewTimeout; tests shorten it).
	sharedTimeout time.Duration
}

var _ admission.Handler = &Handler{}

const (
	// cacheTTL is how long an ensured template is trusted to exist before the API server is
	// asked again; it bounds how long a deleted template stays missing.
	cacheTTL = time.Minute
	// maxCacheEntries bounds each cache, the least recently used entries going first:
	// namespaces × distinct requests is small in practice, but a hostile user could vary the
	// model annotation endlessly.
	maxCacheEntries = 10000
	// maxReviewTimeout is the longest an API server waits for a webhook (timeoutSeconds is at most
	// 30): no shared work needs to outlive it.
	maxReviewTimeout = 30 * time.Second
)

// NewHandler returns a Handler that creates templates through client.
func NewHandler(client TemplateClient, opts ...Option) (*Handler, error) {
	return newHandler(client, clock.RealClock{}, opts...)
}

// newHandler is NewHandler on clk, which tells when cached entries expire.
func newHandler(client TemplateClient, clk cache.Clock, opts ...Option) (*Handler, error) {
	if client == nil {
		return nil, errors.New("podinject: a TemplateClient is required (NewAPIClient for a cluster)")
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, fmt.Errorf("podinject: %w", err)
	}
	return &Handler{
		opts:          o,
		client:        client,
		ensured:       cache.NewLRUExpireCacheWithClock(maxCacheEntries, clk),
		verdicts:      cache.NewLRUExpireCacheWithClock(maxCacheEntries, clk),
		templates:     cache.NewLRUExpireCacheWithClock(maxCacheEntries, clk),
		sharedTimeout: maxReviewTimeout,
	}, nil
}

// Handle injects the claim into an annotated pod, or denies it with what to fix. It serves the
// handler through controller-runtime's admission.Webhook; the webhook binary uses ServeHTTP,
// which decodes the review and the pod in one pass.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	if !isPodCreate(req.Operation, req.Resource, req.SubResource) {
		return notPodCreate()
	}
	pod, err := decodePod(req.Object.Raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	return h.handle(ctx, req.Namespace, req.DryRun, pod)
}

func notPodCreate() admission.Response {
	return admission.Allowed("not a pod creation; nothing to inject")
}

func isPodCreate(op admissionv1.Operation, resource metav1.GroupVersionResource, subResource string) bool {
	return op == admissionv1.Create && resource.Group == "" && resource.Resource == "pods" && subResource == ""
}

// handle is Handle once the pod is decoded; namespace is the request's.
func (h *Handler) handle(ctx context.Context, namespace string, dryRun *bool, pod *podView) admission.Response {
	annotations := pod.Metadata.Annotations
	_, annotated := annotations[h.opts.annotation(annCount)]
	if !annotated && !h.opts.hasExtended(pod) {
		return admission.Allowed("no " + h.opts.annotation(annCount) + " annotation; nothing to inject")
	}
	namespace, refused := h.reviewNamespace(namespace, pod)
	if refused != nil {
		return *refused
	}
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "pod", klog.KRef(namespace, pod.name()))
	ctx = klog.NewContext(ctx, logger)
	if resp, gone := expired(ctx); gone {
		return resp
	}
	if !annotated {
		return h.handleExtended(ctx, namespace, dryRun, pod)
	}

	want, errs := h.opts.parseRequest(annotations)
	containers, cerrs := h.opts.chosenContainers(pod)
	errs = append(errs, cerrs...)
	if len(pod.Spec.Containers) == 0 {
		errs = append(errs, field.Required(field.NewPath("spec", "containers"), "a pod needs a container to give GPUs to"))
	}
	errs = append(errs, h.opts.extendedWithAnnotation(pod)...)
	if len(errs) > 0 {
		return denied(pod, errs)
	}
	if resp, served := h.prioritizedListServed(ctx, pod, want); !served {
		return resp
	}
	if resp, ok := h.memoryShare(ctx, pod, &want); !ok {
		return resp
	}
	template, err := h.template(namespace, want)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	perPod := corev1.PodResourceClaim{Name: ClaimName, ResourceClaimTemplateName: ptr.To(template.Name)}
	entry, groupWarnings, resp, ok := h.groupEntry(ctx, namespace, pod, perPod)
	if !ok {
		return resp
	}
	p, errs := planInjection(pod, entry, containers)
	if len(errs) > 0 {
		return denied(pod, errs)
	}

	warnings := append(h.opts.unknownAnnotations(annotations), groupWarnings...)
	if resp, gone := expired(ctx); gone {
		return resp
	}
	// A group's own template or claim is the user's: only a managed template is checked and
	// created.
	if managed := entry.ResourceClaimName == nil && ptr.Deref(entry.ResourceClaimTemplateName, "") == template.Name; managed {
		more, err := h.validate(ctx, template)
		if err != nil {
			return admission.Denied(fmt.Sprintf("the GPU request of annotation %s is not valid: %v", h.opts.annotation(annCount), err)).WithWarnings(warnings...)
		}
		warnings = append(warnings, more...)
		if resp, failed := h.ensureUnlessDryRun(ctx, dryRun, template); failed {
			return resp.WithWarnings(warnings...)
		}
	}
	ops := p.patch(pod, entry)
	if len(ops) == 0 {
		return admission.Allowed("the GPU claim is already injected").WithWarnings(warnings...)
	}
	logger.V(3).Info("Injecting GPU claim", "entry", describeEntry(entry), "podGroup", pod.podGroupName(), "count", want.Count, "containers", len(p.containers))
	return admission.Patched("injected the GPU claim", ops...).WithWarnings(warnings...)
}

// reviewNamespace is the namespace of the review (the request's, else the pod's), or the denial of
// a review that names none or one the webhook configuration excludes.
func (h *Handler) reviewNamespace(namespace string, pod *podView) (string, *admission.Response) {
	if namespace == "" {
		namespace = pod.Metadata.Namespace
	}
	var resp admission.Response
	switch {
	case namespace == "":
		resp = admission.Denied("the review names no namespace; the API server always names the pod's")
	case slices.Contains(h.opts.excluded, namespace):
		resp = admission.Denied(fmt.Sprintf("namespace %s is excluded from GPU injection by the webhook configuration, whose namespaceSelector keeps its pods from ever being sent here; create GPU pods in another namespace", namespace))
	default:
		return namespace, nil
	}
	return namespace, &resp
}

// ensureUnlessDryRun ensures template unless the review is a dry run, and answers the review
// (failed) when that ends it: its deadline passed, the template client refused the template (the
// user's to fix), or the API server failed (an error, retried).
func (h *Handler) ensureUnlessDryRun(ctx context.Context, dryRun *bool, template *resourceapi.ResourceClaimTemplate) (admission.Response, bool) {
	// Dry-run promises no side effects (the configuration says sideEffects: NoneOnDryRun); the pod
	// is not stored either, so nothing will look for the template.
	if dryRun != nil && *dryRun {
		return admission.Response{}, false
	}
	if resp, gone := expired(ctx); gone {
		return resp, true
	}
	err := h.ensure(ctx, template)
	if err == nil {
		return admission.Response{}, false
	}
	if resp, gone := expired(ctx); gone {
		return resp, true
	}
	logger := klog.FromContext(ctx)
	var refused *RefusedError
	if errors.As(err, &refused) {
		logger.V(2).Info("Refusing managed ResourceClaimTemplate", "template", klog.KObj(template), "reason", refused.Reason)
		return admission.Denied(refused.Reason), true
	}
	logger.Error(err, "Ensuring managed ResourceClaimTemplate failed", "template", klog.KObj(template))
	return admission.Errored(http.StatusInternalServerError, err), true
}

// expired answers a review whose deadline passed or whose caller left: the API server no longer
// waits for the answer, so nothing more is worth doing, least of all creating a template.
func expired(ctx context.Context) (admission.Response, bool) {
	if ctx.Err() == nil {
		return admission.Response{}, false
	}
	return admission.Errored(http.StatusRequestTimeout, fmt.Errorf("gave up on the review: %w", context.Cause(ctx))), true
}

// template is options.template, cached by request; each caller gets its own copy.
func (h *Handler) template(namespace string, want Request) (*resourceapi.ResourceClaimTemplate, error) {
	key := strconv.Itoa(want.Count) + "\x00" + want.Model + "\x00"
	if len(want.Models) > 0 { // no model in a list has a comma; other keys start with a digit
		key = "models\x00" + strings.Join(want.Models, ",") + "\x00" + key
	}
	if want.Memory != nil {
		key += want.Memory.String()
		if want.MemoryShare {
			key += "\x00share"
		}
	}
	var t *resourceapi.ResourceClaimTemplate
	if cached, ok := h.templates.Get(key); ok {
		t = cached.(*resourceapi.ResourceClaimTemplate)
	} else {
		var err error
		if t, err = h.opts.template("", want); err != nil {
			return nil, err
		}
		h.templates.Add(key, t, cacheTTL)
	}
	t = t.DeepCopy()
	t.Namespace = namespace
	return t, nil
}

// ensure creates the template once per namespace and TTL, or until the template is deleted
// (Forget); concurrent pods asking for the same one share one API request.
func (h *Handler) ensure(ctx context.Context, template *resourceapi.ResourceClaimTemplate) error {
	key := template.Namespace + "/" + template.Name
	if _, ok := h.ensured.Get(key); ok {
		return nil
	}
	_, err := h.shared(ctx, "ensure/"+key, func(ctx context.Context) (any, error) {
		if err := h.client.EnsureTemplate(ctx, template); err != nil {
			return nil, err
		}
		h.ensured.Add(key, struct{}{}, cacheTTL)
		return nil, nil
	})
	return err
}

// Forget drops what the handler remembers of a managed template: call it when the template is
// deleted (APIClient.OnDelete), so that the next pod asking for it creates it again at once
// instead of getting a claim from a template that is gone.
func (h *Handler) Forget(namespace, name string) {
	h.ensured.Remove(namespace + "/" + name)
}

// validate runs the optional Validator; its verdict depends on the template's content only, which
// the name encodes, so it is cached by name.
func (h *Handler) validate(ctx context.Context, template *resourceapi.ResourceClaimTemplate) ([]string, error) {
	if h.opts.validator == nil {
		return nil, nil
	}
	if warnings, ok := h.verdicts.Get(template.Name); ok {
		return warnings.([]string), nil
	}
	v, err := h.shared(ctx, "validate/"+template.Name, func(ctx context.Context) (any, error) {
		warnings, err := h.opts.validator.ValidateTemplate(ctx, template)
		if err != nil {
			return nil, err
		}
		// A validation its context cut short may have missed what it looks for.
		if ctx.Err() == nil {
			h.verdicts.Add(template.Name, warnings, cacheTTL)
		}
		return warnings, nil
	})
	if err != nil {
		return nil, err
	}
	return v.([]string), nil
}

// shared runs fn once for all concurrent callers of key. fn's context is its own, bounded by
// maxReviewTimeout, not the first caller's: a caller whose review times out or is abandoned must not
// fail the others waiting for the same work. Each caller waits as long as its own context allows.
func (h *Handler) shared(ctx context.Context, key string, fn func(context.Context) (any, error)) (any, error) {
	done := h.inflight.DoChan(key, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.sharedTimeout)
		defer cancel()
		return fn(ctx)
	})
	select {
	case r := <-done:
		return r.Val, r.Err
	case <-ctx.Done():
		return nil, fmt.Errorf("gave up waiting for %s: %w", key, context.Cause(ctx))
	}
}

// denied refuses pod for errs, in the shape and within the bounds of every denial of the webhook.
func denied(pod *podView, errs field.ErrorList) admission.Response {
	return denial.Fields("Pod", denial.Name(pod.Metadata.Name, pod.Metadata.GenerateName), errs)
}
