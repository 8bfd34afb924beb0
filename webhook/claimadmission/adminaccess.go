package claimadmission

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
	"github.com/gpu-dra/gpu-dra/internal/servedfeatures"
	"github.com/gpu-dra/gpu-dra/webhook/denial"
)

// AdminAccessPath is where AdminAccessHandler is served; the chart's mutating entry
// admin-access.resourceclaims.<driver> points here.
const AdminAccessPath = "/check-admin-access"

// AdminAccessSupport tells what the API server does with a request's adminAccess.
type AdminAccessSupport interface {
	AdminAccess(ctx context.Context) (servedfeatures.AdminAccessSupport, error)
}

// NamespaceLabels reads a namespace's labels.
type NamespaceLabels interface {
	NamespaceLabels(ctx context.Context, namespace string) (map[string]string, error)
}

// AdminAccessHandler explains, before the API server refuses it, why a claim or template asking
// for admin access cannot be created in a namespace without the resource.kubernetes.io/admin-access
// label. The API server checks the label itself (1.33+ with DRAAdminAccess on), but after mutating
// admission and after dropping the field where the gate is off, so the check runs in the mutating
// phase: it never changes the object, and it denies only what the API server would deny anyway.
// Where the API server drops adminAccess it warns instead. Any failure to find out admits: the
// API server's own check still applies.
type AdminAccessHandler struct {
	Support    AdminAccessSupport
	Namespaces NamespaceLabels
}

var _ admission.Handler = &AdminAccessHandler{}

// Handle implements admission.Handler.
func (h *AdminAccessHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	gvk := schema.GroupVersionKind(req.Kind)
	if req.Operation != admissionv1.Create || !resourceversion.Supported(gvk) {
		return admission.Allowed("")
	}
	obj, err := resourceversion.Decode(req.Object.Raw, gvk)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("%s %s/%s: %w", gvk.Kind, req.Namespace, req.Name, err))
	}
	path := adminAccessPath(obj)
	if path == nil {
		return admission.Allowed("")
	}
	logger := klog.FromContext(ctx).WithValues("kind", gvk.Kind, "namespace", req.Namespace, "name", req.Name)
	support, err := h.Support.AdminAccess(ctx)
	if err != nil {
		logger.Info("Cannot tell whether the API server serves adminAccess; leaving the check to it", "err", err)
		return admission.Allowed("")
	}
	switch support {
	case servedfeatures.AdminAccessDropped:
		return admission.Allowed("").WithWarnings(fmt.Sprintf("%s: this cluster drops adminAccess (feature gate DRAAdminAccess is off), so the devices are allocated exclusively, as for any other request; enable DRAAdminAccess, or remove adminAccess", path))
	case servedfeatures.AdminAccessServed:
		return admission.Allowed("")
	}
	labels, err := h.Namespaces.NamespaceLabels(ctx, req.Namespace)
	if err != nil {
		logger.Info("Cannot read the namespace's labels; leaving the check to the API server", "err", err)
		return admission.Allowed("")
	}
	if labels[resourceapi.DRAAdminNamespaceLabelKey] == "true" {
		return admission.Allowed("")
	}
	forbidden := field.Forbidden(path, fmt.Sprintf("admin access to devices requires the label %s=true on namespace %q, which it lacks; a cluster administrator can add it with: kubectl label namespace %s %s=true",
		resourceapi.DRAAdminNamespaceLabelKey, req.Namespace, req.Namespace, resourceapi.DRAAdminNamespaceLabelKey))
	logger.V(2).Info("Denied admin access", "reason", forbidden.Error())
	return denial.Invalid(gvk.Kind, denial.Name(req.Name, obj.GenerateName()), []string{forbidden.Error()})
}

// adminAccessPath is the field of the first request that asks for admin access, nil for none.
func adminAccessPath(obj *resourceversion.Object) *field.Path {
	for i, r := range obj.Spec().Devices.Requests {
		if r.Exactly == nil || !ptr.Deref(r.Exactly.AdminAccess, false) {
			continue
		}
		p := obj.SpecPath().Child("devices", "requests").Index(i)
		if obj.IsV1Beta1() {
			return p.Child("adminAccess")
		}
		return p.Child("exactly", "adminAccess")
	}
	return nil
}
