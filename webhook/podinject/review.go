package podinject

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	admissionv1 "k8s.io/api/admission/v1"
	admissionv1beta1 "k8s.io/api/admission/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	sigsjson "sigs.k8s.io/json"

	"github.com/gpu-dra/gpu-dra/webhook/reviewbody"
)

// maxReviewSize is controller-runtime's limit for an AdmissionReview body.
const maxReviewSize = reviewbody.MaxSize

// podReview is the part of an AdmissionReview the handler reads. The pod is decoded in the same
// pass as the review: controller-runtime's admission.Webhook scans a pod four times (to find the
// kind, to validate, to copy it out, then the handler decodes it), which cost more CPU per review
// than the injection itself and kept the p99 over the 1 ms target at 1,000 reviews per second.
type podReview = admissionReview[*podView]

// admissionReview is an AdmissionReview whose request object decodes into O.
type admissionReview[O any] struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Request    *reviewRequest[O] `json:"request"`
}

type reviewRequest[O any] struct {
	UID         types.UID                   `json:"uid"`
	Resource    metav1.GroupVersionResource `json:"resource"`
	SubResource string                      `json:"subResource"`
	Namespace   string                      `json:"namespace"`
	Operation   admissionv1.Operation       `json:"operation"`
	DryRun      *bool                       `json:"dryRun"`
	Object      O                           `json:"object"`
}

// ServeHTTP answers an AdmissionReview (admission.k8s.io/v1 or v1beta1) for a pod, in the version
// it came in, the way controller-runtime's admission.Webhook does: errors are answered with a
// review carrying the status, not with an HTTP error. Register it on controller-runtime's webhook
// server, which adds TLS, certificate reloading and the request metrics.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	logger := klog.FromContext(r.Context()).WithValues("webhook", Path)
	ctx := klog.NewContext(r.Context(), logger)
	if d := reviewTimeout(r.URL.RawQuery); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	review, code, err := readPodReview(r)
	var resp admission.Response
	switch {
	case err != nil:
		logger.Error(err, "Bad AdmissionReview", "remote", r.RemoteAddr)
		resp = admission.Errored(code, err)
	case !isPodCreate(review.Request.Operation, review.Request.Resource, review.Request.SubResource):
		resp = notPodCreate()
	default:
		resp = h.handleRecovered(ctx, review)
	}
	out := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"}}
	var uid types.UID
	if review != nil {
		out.APIVersion = review.APIVersion
		uid = review.Request.UID
	}
	if err := resp.Complete(admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{UID: uid}}); err != nil {
		logger.Error(err, "Encoding the JSON patch failed")
		resp = admission.Errored(http.StatusInternalServerError, err)
		resp.UID = uid
	}
	out.Response = &resp.AdmissionResponse
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(out); err != nil {
		logger.Error(err, "Writing the AdmissionReview response failed")
	}
}

// reviewTimeout is how long the API server waits for the answer: it sends its webhook timeout as
// the timeout query parameter (a Go duration, "10s"). Zero when absent or unreadable.
func reviewTimeout(rawQuery string) time.Duration {
	for param := range strings.SplitSeq(rawQuery, "&") {
		if value, ok := strings.CutPrefix(param, "timeout="); ok {
			if d, err := time.ParseDuration(value); err == nil {
				return d
			}
		}
	}
	return 0
}

// readPodReview reads the body; on error it returns the HTTP status that names the problem.
func readPodReview(r *http.Request) (*podReview, int32, error) {
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		return nil, http.StatusBadRequest, fmt.Errorf("Content-Type %q: an AdmissionReview must be sent as application/json", ct)
	}
	var review *podReview
	code, err := reviewbody.Read(r, func(body []byte) (int32, error) {
		var err error
		if review, err = decodeReview(body); err != nil {
			var code int32
			review, code, err = envelope(body, err)
			return code, err
		}
		if err := checkEnvelope(review.APIVersion, review.Kind, review.Request != nil); err != nil {
			review = nil
			return http.StatusBadRequest, err
		}
		return 0, nil
	})
	return review, code, err
}

// decodeReview decodes with encoding/json/v2 (the module that mirrors it until Go 1.27), which
// validates and decodes in a single pass at twice the speed of encoding/json. Its defaults are
// stricter (duplicate names, invalid UTF-8); whatever it refuses is decoded again the way Handle
// decodes, so a review gets the same answer either way (FuzzHandle compares the two).
func decodeReview(body []byte) (*podReview, error) {
	review := &podReview{}
	if err := jsonv2.Unmarshal(body, review); err == nil {
		return review, nil
	}
	review = &podReview{}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(body, review); err != nil {
		return nil, err
	}
	return review, nil
}

// envelope explains a review the one-pass decode refused. A review whose envelope is sound but
// whose pod is not gets the error Handle gives, with the review's UID, so the API server shows the
// user what is wrong with the pod rather than a UID mismatch.
func envelope(body []byte, decodeErr error) (*podReview, int32, error) {
	raw := &admissionReview[json.RawMessage]{}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(body, raw); err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("decode AdmissionReview: %w", err)
	}
	if err := checkEnvelope(raw.APIVersion, raw.Kind, raw.Request != nil); err != nil {
		return nil, http.StatusBadRequest, err
	}
	review := &podReview{APIVersion: raw.APIVersion, Kind: raw.Kind, Request: &reviewRequest[*podView]{UID: raw.Request.UID}}
	if _, err := decodePod(raw.Request.Object); err != nil {
		return review, http.StatusBadRequest, err
	}
	return review, http.StatusBadRequest, fmt.Errorf("decode AdmissionReview: %w", decodeErr)
}

func checkEnvelope(apiVersion, kind string, hasRequest bool) error {
	if kind != "AdmissionReview" || (apiVersion != admissionv1.SchemeGroupVersion.String() && apiVersion != admissionv1beta1.SchemeGroupVersion.String()) {
		return fmt.Errorf("apiVersion %q, kind %q: want an AdmissionReview of admission.k8s.io/v1 or v1beta1", apiVersion, kind)
	}
	if !hasRequest {
		return errors.New("AdmissionReview without request")
	}
	return nil
}

// handleRecovered turns a panic into an error response, as admission.Webhook does, so one bad pod
// cannot take the connection down with it.
func (h *Handler) handleRecovered(ctx context.Context, review *podReview) (resp admission.Response) {
	defer func() {
		if r := recover(); r != nil {
			klog.FromContext(ctx).Error(fmt.Errorf("%v", r), "Pod injection panicked", "uid", review.Request.UID)
			resp = admission.Errored(http.StatusInternalServerError, fmt.Errorf("panic: %v [recovered]", r))
		}
	}()
	pod := review.Request.Object
	if pod == nil {
		// A missing or null object fails in Handle's decoder too; give its answer.
		_, err := decodePod(nil)
		return admission.Errored(http.StatusBadRequest, err)
	}
	return h.handle(ctx, review.Request.Namespace, review.Request.DryRun, pod)
}
