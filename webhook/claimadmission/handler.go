// Package claimadmission is the webhook's admission side for ResourceClaims and
// ResourceClaimTemplates: it decodes AdmissionReviews, runs the claim validation
// (internal/analysis/claimvalidation) on them, answers with the verdict and counts the verdicts,
// and explains ahead of the API server why a claim asking for admin access is refused.
package claimadmission

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
	"github.com/gpu-dra/gpu-dra/webhook/denial"
)

// Handler serves a claimvalidation.Validator as a controller-runtime admission handler for ResourceClaims and
// ResourceClaimTemplates of every resource.k8s.io version.
type Handler struct {
	Validator *claimvalidation.Validator
}

var _ admission.Handler = &Handler{}

// Handle implements admission.Handler.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	logger := klog.FromContext(ctx).WithValues("kind", req.Kind.Kind, "version", req.Kind.Version, "namespace", req.Namespace, "name", req.Name, "operation", req.Operation)
	ctx = klog.NewContext(ctx, logger)
	// The chart registers CREATE only: claim and template specs are immutable, and judging
	// updates would block removing the finalizers of old objects.
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	gvk := schema.GroupVersionKind(req.Kind)
	if !resourceversion.Supported(gvk) {
		return admission.Allowed("not a resource.k8s.io ResourceClaim or ResourceClaimTemplate")
	}
	obj, err := resourceversion.DecodeJSON(req.Object.Raw, gvk)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("%s %s/%s: %w", gvk.Kind, req.Namespace, req.Name, err))
	}
	res := h.Validator.Validate(ctx, obj)
	warnings := res.WarningMessages()
	if len(res.Errors) > 0 {
		denied := res.ErrorMessages()
		logger.V(2).Info("Denied", "reasons", denied)
		verdicts.WithLabelValues("denied", gvk.Kind, gvk.Version).Inc()
		// generateName objects have no name yet; claims made from templates are such.
		return denial.Invalid(gvk.Kind, denial.Name(req.Name, obj.GenerateName()), denied).WithWarnings(warnings...)
	}
	if len(warnings) > 0 {
		logger.V(2).Info("Admitted with warnings", "warnings", warnings)
		verdicts.WithLabelValues("warned", gvk.Kind, gvk.Version).Inc()
	} else {
		verdicts.WithLabelValues("allowed", gvk.Kind, gvk.Version).Inc()
	}
	return admission.Allowed("").WithWarnings(warnings...)
}
