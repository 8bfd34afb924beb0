package podinject

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// FuzzParseAnnotations feeds arbitrary annotation values through parsing, container choice and
// template building. Whatever is accepted must become a template the API server accepts whose
// selectors compile and select a GPU with exactly the asked model and memory; whatever is
// rejected must be rejected with a bounded message naming the annotation.
// Seeds: testdata/fuzz/FuzzParseAnnotations. Run: go test -fuzz=FuzzParseAnnotations ./webhook/podinject
func FuzzParseAnnotations(f *testing.F) {
	f.Add("2", "LATEST-GPU-MODEL", "40Gi", "app")
	f.Fuzz(func(t *testing.T, count, model, memory, containers string) {
		o, err := newOptions(nil)
		if err != nil {
			t.Fatal(err)
		}
		ann := map[string]string{o.annotation(annCount): count}
		// An empty fuzz string stands for "annotation absent"; explicit empties are covered by
		// the table tests.
		for key, v := range map[string]string{annModel: model, annMemory: memory, annContainers: containers} {
			if v != "" {
				ann[o.annotation(key)] = v
			}
		}
		pod := &podView{}
		pod.Metadata.Annotations = ann
		pod.Spec.InitContainers = []containerView{{Name: "init"}}
		pod.Spec.Containers = []containerView{{Name: "app"}, {Name: "sidecar"}}
		req, errs := o.parseRequest(ann)
		chosen, cerrs := o.chosenContainers(pod)
		errs = append(errs, cerrs...)
		if len(errs) > 0 {
			for _, e := range errs {
				if !strings.HasPrefix(e.Field, "metadata.annotations["+o.driverName+"/") {
					t.Errorf("error on field %q, want an annotation", e.Field)
				}
				if len(e.Error()) > 1024 {
					t.Errorf("message of %d bytes: %.200s...", len(e.Error()), e.Error())
				}
			}
			return
		}
		if req.Count < 1 || req.Count > o.countLimit() {
			t.Fatalf("accepted count %d from %q", req.Count, count)
		}
		if len(chosen) == 0 {
			t.Fatalf("accepted containers %q but chose none", containers)
		}
		for _, i := range chosen {
			if i < 0 || i >= len(pod.Spec.Containers) {
				t.Fatalf("chose container index %d", i)
			}
		}
		tmpl, err := o.template("ns", req)
		if err != nil {
			t.Fatal(err)
		}
		if errs := validation.IsDNS1123Subdomain(tmpl.Name); len(errs) > 0 {
			t.Fatalf("template name %q: %v", tmpl.Name, errs)
		}
		devModel := "LATEST-GPU-MODEL"
		if req.Model != "" {
			devModel = req.Model
		}
		devMemory := "80Gi"
		if req.Memory != nil {
			devMemory = req.Memory.String()
		}
		if len(req.Models) > 0 {
			// A list: each subrequest, in order, selects a GPU of its model and no other's.
			subs := tmpl.Spec.Spec.Devices.Requests[0].FirstAvailable
			if len(subs) != len(req.Models) || len(req.Models) < 2 || len(req.Models) > resourceapi.FirstAvailableDeviceRequestMaxSize {
				t.Fatalf("models %q from %q became %d subrequests", req.Models, model, len(subs))
			}
			for i, sub := range subs {
				if !selectorsMatch(t, sub.Selectors, device(o.driverName, req.Models[i], devMemory)) {
					t.Fatalf("subrequest %s does not select model %q", sub.Name, req.Models[i])
				}
				if selectorsMatch(t, sub.Selectors, device(o.driverName, req.Models[(i+1)%len(subs)], devMemory)) {
					t.Fatalf("subrequest %s selects model %q too", sub.Name, req.Models[(i+1)%len(subs)])
				}
			}
			return
		}
		if !selects(t, tmpl, device(o.driverName, devModel, devMemory)) {
			t.Fatalf("template for model %q memory %q does not select a GPU with exactly those: %v",
				model, memory, tmpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors)
		}
	})
}

// FuzzHandle sends arbitrary pod JSON through the handler, served both by controller-runtime's
// admission.Webhook and by the one-pass ServeHTTP: neither may panic, both must give the same
// verdict and patch, and a patch must apply to the object it was computed from.
// Seeds: testdata/fuzz/FuzzHandle. Run: go test -fuzz=FuzzHandle ./webhook/podinject
func FuzzHandle(f *testing.F) {
	f.Add([]byte(`{"metadata":{"namespace":"ns","annotations":{"gpu.example.com/count":"1"}},"spec":{"containers":[{"name":"app"}]}}`))
	h, err := NewHandler(&fakeClient{})
	if err != nil {
		f.Fatal(err)
	}
	served := servers(h)
	viaWebhook, viaServeHTTP := served["admission.Webhook"], served["ServeHTTP"]
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			// Not a review the API server could send; TestServeHTTPBadReview covers bad bodies.
			return
		}
		req := admissionRequestRaw(admissionv1.Create, raw)
		want := review(t, viaWebhook, admissionv1.SchemeGroupVersion.String(), req)
		got := review(t, viaServeHTTP, admissionv1.SchemeGroupVersion.String(), req)
		if got.Allowed != want.Allowed || !bytes.Equal(got.Patch, want.Patch) {
			t.Fatalf("ServeHTTP answered allowed=%v patch %s, admission.Webhook allowed=%v patch %s (%+v / %+v)",
				got.Allowed, got.Patch, want.Allowed, want.Patch, got.Result, want.Result)
		}
		if len(got.Patch) == 0 {
			return
		}
		patch, err := jsonpatch.DecodePatch(got.Patch)
		if err != nil {
			t.Fatalf("patch %s: %v", got.Patch, err)
		}
		if _, err := patch.Apply(raw); err != nil {
			t.Fatalf("patch %s does not apply to %s: %v", got.Patch, raw, err)
		}
	})
}

func admissionRequestRaw(op admissionv1.Operation, raw []byte) admission.Request {
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       "fuzz",
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Namespace: "ns",
		Operation: op,
		Object:    runtime.RawExtension{Raw: raw},
	}}
}
