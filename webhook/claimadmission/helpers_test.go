package claimadmission

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation"
	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation/claimvalidationtest"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// testdata is the claim validation's: the handler is judged on the same inventory, node groups
// and cases as the validator it serves.
const testdata = "../../internal/analysis/claimvalidation/testdata"

func loadInventory(tb testing.TB) *inventory.Objects {
	return claimvalidationtest.Inventory(tb, testdata)
}

func newValidator(tb testing.TB, lister feasibility.Lister, deny ...claimvalidation.Rule) *claimvalidation.Validator {
	tb.Helper()
	return claimvalidationtest.NewValidator(tb, testdata, lister, deny...)
}

// review sends obj (any resource.k8s.io version) as an AdmissionReview through the
// controller-runtime webhook, as the API server would.
func review(t testing.TB, h admission.Handler, obj runtime.Object, op admissionv1.Operation) *admissionv1.AdmissionResponse {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	gvk := obj.GetObjectKind().GroupVersionKind()
	meta := obj.(metav1.Object)
	ar := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID("test"),
			Kind:      metav1.GroupVersionKind{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind},
			Resource:  metav1.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resourceOf(gvk.Kind)},
			Name:      meta.GetName(),
			Namespace: meta.GetNamespace(),
			Operation: op,
			Object:    runtime.RawExtension{Raw: raw},
		},
	}
	if op == admissionv1.Update {
		ar.Request.OldObject = runtime.RawExtension{Raw: raw}
	}
	return post(t, h, ar)
}

func post(t testing.TB, h admission.Handler, ar any) *admissionv1.AdmissionResponse {
	t.Helper()
	body, err := json.Marshal(ar)
	if err != nil {
		t.Fatal(err)
	}
	return postRaw(t, h, body)
}

// postRaw sends body through controller-runtime's admission.Webhook around h and, when h is the
// Handler, through the Handler's own ServeHTTP as the server serves it, and requires the same
// answer from both.
func postRaw(t testing.TB, h admission.Handler, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	want := serveReview(t, &admission.Webhook{Handler: h}, body)
	if own, ok := h.(*Handler); ok {
		got := serveReview(t, own, body)
		if !json.Valid(body) && got.Result != nil && want.Result != nil {
			// Only the wording of the decoder's complaint differs.
			got.Result.Message = want.Result.Message
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Handler.ServeHTTP answers differently from admission.Webhook:\n got: %+v\nwant: %+v", got, want)
		}
	}
	return want
}

func serveReview(t testing.TB, h http.Handler, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/validate-resource-claim", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("response %q: %v", rec.Body.String(), err)
	}
	if out.Response == nil {
		t.Fatalf("no response in %s", rec.Body.String())
	}
	return out.Response
}

func resourceOf(kind string) string {
	if kind == "ResourceClaimTemplate" {
		return "resourceclaimtemplates"
	}
	return "resourceclaims"
}

// unstructuredFor decodes a manifest in the version it is written in.
func unstructuredFor(raw []byte) (runtime.Object, *resourceversion.Object, error) {
	obj, err := resourceversion.Decode(raw, schema.GroupVersionKind{})
	if err != nil {
		return nil, nil, err
	}
	typed, err := obj.To(obj.Arrived.Version)
	if err != nil {
		return nil, nil, err
	}
	if m, ok := typed.(interface{ SetNamespace(string) }); ok {
		m.SetNamespace("default")
	}
	return typed, obj, nil
}

// validObject decodes testdata's valid/<name>.yaml in the version it is written in.
func validObject(tb testing.TB, name string) runtime.Object {
	tb.Helper()
	raw, err := os.ReadFile(filepath.Join(testdata, "valid", name+".yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	obj, _, err := unstructuredFor(raw)
	if err != nil {
		tb.Fatal(err)
	}
	return obj
}
