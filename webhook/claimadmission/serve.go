package claimadmission

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	jsonv2 "github.com/go-json-experiment/json"
	admissionv1 "k8s.io/api/admission/v1"
	admissionv1beta1 "k8s.io/api/admission/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	sigsjson "sigs.k8s.io/json"

	"github.com/gpu-dra/gpu-dra/webhook/reviewbody"
)

// claimReview is the part of an AdmissionReview the handler reads. The object stays raw: Handle
// decodes it in the version the review names.
type claimReview struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Request    *reviewRequest `json:"request"`
}

type reviewRequest struct {
	UID       types.UID               `json:"uid"`
	Kind      metav1.GroupVersionKind `json:"kind"`
	Name      string                  `json:"name"`
	Namespace string                  `json:"namespace"`
	Operation admissionv1.Operation   `json:"operation"`
	Object    json.RawMessage         `json:"object"`
}

// ServeHTTP answers an AdmissionReview (admission.k8s.io/v1 or v1beta1) for a claim or template
// with Handle's answer, the way controller-runtime's admission.Webhook serves Handle, errors
// included. admission.Webhook decodes a review with the API machinery's universal deserializer,
// which scans the body several times and copies the object out before Handle decodes it again:
// at thousands of template reviews a second those allocations are what the garbage collector
// spends its time on, and its pauses are the tail. Here the body is read into a pooled buffer, the
// envelope decoded in one pass, and the object handed to Handle as it arrived.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	logger := klog.FromContext(r.Context())
	review, code, err := readClaimReview(r)
	var resp admission.Response
	var uid types.UID
	out := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"}}
	if err != nil {
		logger.Error(err, "Bad AdmissionReview", "remote", r.RemoteAddr)
		resp = admission.Errored(code, err)
	} else {
		out.APIVersion, uid = review.APIVersion, review.Request.UID
		obj := review.Request.Object
		if string(obj) == "null" {
			// As runtime.RawExtension reads it.
			obj = nil
		}
		req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{UID: uid, Kind: review.Request.Kind,
			Name: review.Request.Name, Namespace: review.Request.Namespace, Operation: review.Request.Operation,
			Object: runtime.RawExtension{Raw: obj}}}
		resp = h.handleRecovered(r.Context(), req)
	}
	resp.UID = uid
	out.Response = &resp.AdmissionResponse
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(out); err != nil {
		logger.Error(err, "Writing the AdmissionReview response failed")
	}
}

// handleRecovered turns a panic into an error response, as admission.Webhook does, so that one bad
// object cannot take the connection down with it.
func (h *Handler) handleRecovered(ctx context.Context, req admission.Request) (resp admission.Response) {
	defer func() {
		if r := recover(); r != nil {
			klog.FromContext(ctx).Error(fmt.Errorf("%v", r), "Claim validation panicked", "uid", req.UID)
			resp = admission.Errored(http.StatusInternalServerError, fmt.Errorf("panic: %v [recovered]", r))
		}
	}()
	return h.Handle(ctx, req)
}

// readClaimReview reads the body; on error it returns the HTTP status that names the problem.
func readClaimReview(r *http.Request) (*claimReview, int32, error) {
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		return nil, http.StatusBadRequest, fmt.Errorf("contentType=%s, expected application/json", ct)
	}
	review := &claimReview{}
	code, err := reviewbody.Read(r, func(body []byte) (int32, error) {
		// encoding/json/v2 refuses what the API machinery accepts (duplicate names, invalid
		// UTF-8): such a review is decoded again the way admission.Webhook decodes it.
		if err := jsonv2.Unmarshal(body, review); err != nil {
			*review = claimReview{}
			if err := sigsjson.UnmarshalCaseSensitivePreserveInts(body, review); err != nil {
				return http.StatusBadRequest, fmt.Errorf("decode AdmissionReview: %w", err)
			}
		}
		return 0, nil
	})
	if err != nil {
		return nil, code, err
	}
	if review.Kind != "AdmissionReview" || (review.APIVersion != admissionv1.SchemeGroupVersion.String() && review.APIVersion != admissionv1beta1.SchemeGroupVersion.String()) {
		return nil, http.StatusBadRequest, fmt.Errorf("apiVersion %q, kind %q: want an AdmissionReview of admission.k8s.io/v1 or v1beta1", review.APIVersion, review.Kind)
	}
	if review.Request == nil {
		// admission.Webhook hands Handle an empty request, which it lets pass.
		review.Request = &reviewRequest{}
	}
	return review, 0, nil
}
