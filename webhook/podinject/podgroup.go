package podinject

import (
	"context"
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpu-dra/gpu-dra/internal/podgroups"
)

// PodGroups reads the claims a PodGroup shares with its pods (spec.resourceClaims, KEP-5729).
type PodGroups interface {
	// SharedClaims returns what the cluster holds of PodGroup namespace/name. An error means the
	// cluster could not be asked; a group that does not exist, or a cluster that serves no
	// PodGroups, is an answer.
	SharedClaims(ctx context.Context, namespace, name string) (GroupClaims, error)
}

// GroupClaims is a PodGroup as the handler reads it.
type GroupClaims struct {
	// Served: the cluster serves PodGroups with their resourceClaims.
	Served bool
	// Found: the PodGroup exists.
	Found bool
	// Claims are its spec.resourceClaims, in the form of a pod's entries: a pod's entry equal to
	// one of them gets the group's claim.
	Claims []corev1.PodResourceClaim
}

// WithPodGroups lets pods of a PodGroup share the group's GPUs (see Handler.groupEntry). Without
// it every pod gets GPUs of its own.
func WithPodGroups(g PodGroups) Option { return func(o *options) { o.podGroups = g } }

// NotServedWarning is what a pod of a PodGroup is told where the cluster serves no PodGroups.
const NotServedWarning = "this cluster serves no PodGroups with resourceClaims (they need " + podgroups.Needs + "), so the pod gets GPUs of its own instead of its group's"

var podGroupPath = field.NewPath("spec", "schedulingGroup", "podGroupName")

// groupEntry decides the spec.resourceClaims entry of an annotated pod. A pod that belongs to no
// PodGroup, or to one that shares no claim named ClaimName, gets the managed template (perPod).
// A pod of a group whose spec.resourceClaims has an entry named ClaimName gets that entry as it
// is, so the pod uses the one claim the group's template made for the whole group; when the entry
// names a managed template it must be the one the pod's annotations ask for, and when it names
// the user's own template or claim, which decides the GPUs, the model and memory annotations
// (which would be ignored) are denied. ok false ends the review with resp.
func (h *Handler) groupEntry(ctx context.Context, namespace string, pod *podView, perPod corev1.PodResourceClaim) (entry corev1.PodResourceClaim, warnings []string, resp admission.Response, ok bool) {
	group := pod.podGroupName()
	if group == "" || h.opts.podGroups == nil {
		return perPod, nil, resp, true
	}
	g, err := h.opts.podGroups.SharedClaims(ctx, namespace, group)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Reading the pod's PodGroup failed", "podGroup", klog.KRef(namespace, group))
		return entry, nil, admission.Errored(http.StatusServiceUnavailable, fmt.Errorf("cannot read PodGroup %s/%s, whose claims the pod may share: %w", namespace, group, err)), false
	}
	switch {
	case !g.Served:
		return perPod, []string{NotServedWarning}, resp, true
	case !g.Found:
		return entry, nil, denied(pod, field.ErrorList{{Type: field.ErrorTypeNotFound, Field: podGroupPath.String(), BadValue: group,
			Detail: fmt.Sprintf("PodGroup %s does not exist in namespace %s; create the PodGroup before its pods, so the webhook can tell whether they share the group's GPUs", group, namespace)}}), false
	}
	var names []string
	for _, c := range g.Claims {
		if c.Name != ClaimName {
			names = append(names, c.Name)
			continue
		}
		if errs := h.checkGroupEntry(pod, group, c, perPod); len(errs) > 0 {
			return entry, nil, denied(pod, errs), false
		}
		return c, nil, resp, true
	}
	if len(names) > 0 {
		warnings = append(warnings, fmt.Sprintf("PodGroup %s shares the claims %s but none named %q, so the pod gets GPUs of its own; to give it the group's GPUs, name the group's claim %q",
			group, listNames(names, true), ClaimName, ClaimName))
	}
	return perPod, warnings, resp, true
}

// checkGroupEntry denies a pod whose annotations say something else than the group's entry c.
func (h *Handler) checkGroupEntry(pod *podView, group string, c, perPod corev1.PodResourceClaim) field.ErrorList {
	template := ptr.Deref(c.ResourceClaimTemplateName, "")
	if managedName.MatchString(template) {
		if template == ptr.Deref(perPod.ResourceClaimTemplateName, "") {
			return nil
		}
		key := h.opts.annotation(annCount)
		return field.ErrorList{invalid(key, pod.Metadata.Annotations[key], fmt.Sprintf(
			"PodGroup %s shares GPUs of template %s, and this pod's %s annotations ask for those of %s; give the pod the same count, model and memory annotations as the group's other pods",
			group, template, h.opts.driverName, *perPod.ResourceClaimTemplateName))}
	}
	var errs field.ErrorList
	for _, suffix := range []string{annModel, annMemory} {
		key := h.opts.annotation(suffix)
		if value, set := pod.Metadata.Annotations[key]; set {
			errs = append(errs, field.Forbidden(annotationsPath.Key(key), fmt.Sprintf(
				"PodGroup %s shares its claim %q (%s), which decides the GPUs of all its pods, and %q would be ignored; remove the annotation (value %q)",
				group, ClaimName, describeEntry(c), key, shorten(value))))
		}
	}
	return errs
}
