package podinject

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	"sigs.k8s.io/yaml"
)

// fakeClient records the templates the handler ensures.
type fakeClient struct {
	mu        sync.Mutex
	templates map[string]*resourceapi.ResourceClaimTemplate
	calls     int
	err       error
}

func (f *fakeClient) EnsureTemplate(_ context.Context, t *resourceapi.ResourceClaimTemplate) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return f.err
	}
	if f.templates == nil {
		f.templates = map[string]*resourceapi.ResourceClaimTemplate{}
	}
	f.templates[t.Namespace+"/"+t.Name] = t.DeepCopy()
	return nil
}

func (f *fakeClient) names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for k := range f.templates {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// handlerCase is one entry of testdata/cases.yaml.
type handlerCase struct {
	Name       string          `json:"name"`
	MaxPerNode int             `json:"maxPerNode,omitempty"`
	Operation  string          `json:"operation,omitempty"`
	DryRun     bool            `json:"dryRun,omitempty"`
	Pod        json.RawMessage `json:"pod"`
	Want       struct {
		Allowed  bool              `json:"allowed"`
		Message  string            `json:"message,omitempty"`
		Warnings []string          `json:"warnings,omitempty"`
		Patch    []json.RawMessage `json:"patch,omitempty"`
		// Templates are the namespace/name of every template ensured.
		Templates []string `json:"templates,omitempty"`
	} `json:"want"`
}

// loadCases reads a table of test cases from testdata, refusing unknown fields.
func loadCases[C any](t *testing.T, path string) []C {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cases []C
	if err := yaml.UnmarshalStrict(data, &cases); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return cases
}

func admissionRequest(t testing.TB, op admissionv1.Operation, dryRun bool, podJSON []byte) admission.Request {
	t.Helper()
	var meta struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(podJSON, &meta); err != nil {
		t.Fatalf("pod: %v", err)
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       "test",
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Namespace: meta.Metadata.Namespace,
		Name:      meta.Metadata.Name,
		Operation: op,
		DryRun:    ptr.To(dryRun),
		Object:    runtime.RawExtension{Raw: podJSON},
	}}
}

// sortedOps renders patch operations as JSON, ordered by path, so the comparison does not depend
// on the diff library's traversal order.
func sortedOps(t *testing.T, ops []json.RawMessage) []string {
	t.Helper()
	out := make([]string, len(ops))
	for i, op := range ops {
		var v any
		if err := json.Unmarshal(op, &v); err != nil {
			t.Fatalf("patch op %s: %v", op, err)
		}
		b, _ := json.Marshal(v)
		out[i] = string(b)
	}
	slices.Sort(out)
	return out
}

// servers are the two ways the handler is served: controller-runtime's admission.Webhook around
// Handle, and the handler's own one-pass ServeHTTP that the webhook binary registers. Every case
// goes through both and must get the same answer.
func servers(h *Handler) map[string]http.Handler {
	return map[string]http.Handler{"admission.Webhook": &admission.Webhook{Handler: h}, "ServeHTTP": h}
}

// review posts req as an AdmissionReview of apiVersion to serve, the way the API server does,
// and returns the response after checking it echoes the version and the UID.
func review(t testing.TB, serve http.Handler, apiVersion string, req admission.Request) *admissionv1.AdmissionResponse {
	t.Helper()
	out := post(t, serve, "application/json", reviewBody(t, apiVersion, req))
	if out.APIVersion != apiVersion || out.Response.UID != req.UID {
		t.Fatalf("answered %s for UID %q, want %s for %q", out.APIVersion, out.Response.UID, apiVersion, req.UID)
	}
	return out.Response
}

// reviewBody is req as the API server sends it: an AdmissionReview of apiVersion.
func reviewBody(t testing.TB, apiVersion string, req admission.Request) []byte {
	t.Helper()
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: apiVersion, Kind: "AdmissionReview"},
		Request:  &req.AdmissionRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// httpReview is the HTTP request that carries body to the webhook's path.
func httpReview(contentType string, body []byte) *http.Request {
	r := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
	r.Header.Set("Content-Type", contentType)
	return r
}

// post sends body to serve and decodes the AdmissionReview it answers with.
func post(t testing.TB, serve http.Handler, contentType string, body []byte) admissionv1.AdmissionReview {
	t.Helper()
	w := httptest.NewRecorder()
	serve.ServeHTTP(w, httpReview(contentType, body))
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Response == nil {
		t.Fatalf("status %d, answer %q: not an AdmissionReview response (%v)", w.Code, w.Body.String(), err)
	}
	return out
}

func TestHandle(t *testing.T) {
	for _, tc := range loadCases[handlerCase](t, "testdata/cases.yaml") {
		var opts []Option
		if tc.MaxPerNode != 0 {
			opts = append(opts, WithMaxDevicesPerNode(tc.MaxPerNode))
		}
		runCase(t, tc, checkPatchedPod, opts...)
	}
}

// runCase sends the case's pod through both servings of a handler made with opts and compares the
// answer with the case's; check looks at a patched pod.
func runCase(t *testing.T, tc handlerCase, check func(t *testing.T, h *Handler, podJSON, patchJSON []byte), opts ...Option) {
	t.Helper()
	podJSON, err := yaml.YAMLToJSON(tc.Pod)
	if err != nil {
		t.Fatalf("%s: pod: %v", tc.Name, err)
	}
	op := admissionv1.Create
	if tc.Operation != "" {
		op = admissionv1.Operation(tc.Operation)
	}
	req := admissionRequest(t, op, tc.DryRun, podJSON)
	for _, served := range []string{"admission.Webhook", "ServeHTTP"} {
		t.Run(tc.Name+"/"+served, func(t *testing.T) {
			client := &fakeClient{}
			h, err := NewHandler(client, opts...)
			if err != nil {
				t.Fatal(err)
			}
			resp := review(t, servers(h)[served], admissionv1.SchemeGroupVersion.String(), req)

			if resp.Allowed != tc.Want.Allowed {
				t.Fatalf("allowed = %v, want %v (result %+v)", resp.Allowed, tc.Want.Allowed, resp.Result)
			}
			if tc.Want.Message != "" {
				if resp.Result == nil || resp.Result.Message != tc.Want.Message {
					t.Errorf("message:\n got %q\nwant %q", resp.Result.Message, tc.Want.Message)
				}
			}
			if !slices.Equal(resp.Warnings, tc.Want.Warnings) {
				t.Errorf("warnings:\n got %q\nwant %q", resp.Warnings, tc.Want.Warnings)
			}
			var got []json.RawMessage
			if len(resp.Patch) > 0 {
				if err := json.Unmarshal(resp.Patch, &got); err != nil {
					t.Fatalf("patch %s: %v", resp.Patch, err)
				}
			}
			if g, w := sortedOps(t, got), sortedOps(t, tc.Want.Patch); !slices.Equal(g, w) {
				t.Errorf("patch:\n got %s\nwant %s", strings.Join(g, "\n     "), strings.Join(w, "\n     "))
			}
			if len(got) > 0 != (resp.PatchType != nil && *resp.PatchType == admissionv1.PatchTypeJSONPatch) {
				t.Errorf("patch type %v with %d operations", resp.PatchType, len(got))
			}
			if n := client.names(); !slices.Equal(n, tc.Want.Templates) {
				t.Errorf("templates ensured: %q, want %q", n, tc.Want.Templates)
			}
			if len(got) > 0 {
				check(t, h, podJSON, resp.Patch)
			}
		})
	}
}

// TestServeHTTPBadReview: what the one-pass decoder rejects is answered as controller-runtime
// answers it, a review with allowed=false and the HTTP-style code, and names what to send instead.
func TestServeHTTPBadReview(t *testing.T) {
	pod := `{"metadata":{"annotations":{"gpu.example.com/count":"1"}},"spec":{"containers":[{"name":"app"}]}}`
	for _, tc := range []struct {
		name, contentType, body string
		code                    int32
		message                 string
	}{
		{"content type", "text/plain", `{}`, http.StatusBadRequest, `Content-Type "text/plain": an AdmissionReview must be sent as application/json`},
		{"not JSON", "application/json", `{"apiVersion":`, http.StatusBadRequest, "decode AdmissionReview: unexpected end of JSON input"},
		{"pod not an object", "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":[1]}}`, http.StatusBadRequest, "decode pod: json: cannot unmarshal array into Go value of type podinject.podView"},
		{"request not an object", "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":[]}`, http.StatusBadRequest, "decode AdmissionReview: json: cannot unmarshal array into Go struct field admissionReview[encoding/json.RawMessage].request of type podinject.reviewRequest[encoding/json.RawMessage]"},
		{"kind", "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"Pod","request":{}}`, http.StatusBadRequest, `apiVersion "admission.k8s.io/v1", kind "Pod": want an AdmissionReview of admission.k8s.io/v1 or v1beta1`},
		{"version", "application/json", `{"apiVersion":"admission.k8s.io/v2","kind":"AdmissionReview","request":{}}`, http.StatusBadRequest, `apiVersion "admission.k8s.io/v2", kind "AdmissionReview": want an AdmissionReview of admission.k8s.io/v1 or v1beta1`},
		{"no request", "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, http.StatusBadRequest, "AdmissionReview without request"},
		{"too large", "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"object":` + pod + `},"pad":"` + strings.Repeat("x", maxReviewSize) + `"}`, http.StatusRequestEntityTooLarge, "AdmissionReview larger than 7340032 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := NewHandler(&fakeClient{})
			if err != nil {
				t.Fatal(err)
			}
			resp := post(t, h, tc.contentType, []byte(tc.body)).Response
			if resp.Allowed || resp.Result == nil || resp.Result.Code != tc.code || resp.Result.Message != tc.message {
				t.Errorf("got allowed=%v %+v\nwant code %d message %q", resp.Allowed, resp.Result, tc.code, tc.message)
			}
		})
	}
}

// TestServeHTTPVersions: a v1beta1 review is answered as v1beta1, as admission.Webhook does, so
// a configuration that lists both versions works.
func TestServeHTTPVersions(t *testing.T) {
	pod := []byte(`{"metadata":{"namespace":"ns","annotations":{"gpu.example.com/count":"1"}},"spec":{"containers":[{"name":"app"}]}}`)
	for _, version := range []string{"admission.k8s.io/v1", "admission.k8s.io/v1beta1"} {
		h, err := NewHandler(&fakeClient{})
		if err != nil {
			t.Fatal(err)
		}
		if resp := review(t, h, version, admissionRequest(t, admissionv1.Create, false, pod)); !resp.Allowed || len(resp.Patch) == 0 {
			t.Errorf("%s: not patched: %+v", version, resp.Result)
		}
	}
}

// checkPatchedPod applies the patch as the API server would and checks the result is still a
// decodable pod whose every claim reference resolves.
func checkPatchedPod(t *testing.T, h *Handler, podJSON, patchJSON []byte) {
	t.Helper()
	patch, err := jsonpatch.DecodePatch(patchJSON)
	if err != nil {
		t.Fatalf("decode patch: %v", err)
	}
	out, err := patch.Apply(podJSON)
	if err != nil {
		t.Fatalf("apply patch: %v", err)
	}
	var before, after corev1.Pod
	if err := json.Unmarshal(podJSON, &before); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out, &after); err != nil {
		t.Fatalf("patched pod: %v", err)
	}
	if !equality.Semantic.DeepEqual(before.Spec.InitContainers, after.Spec.InitContainers) {
		t.Errorf("init containers changed:\n%v\n%v", before.Spec.InitContainers, after.Spec.InitContainers)
	}
	claims := map[string]bool{}
	for _, rc := range after.Spec.ResourceClaims {
		claims[rc.Name] = true
	}
	for _, c := range after.Spec.Containers {
		for _, ref := range c.Resources.Claims {
			if !claims[ref.Name] {
				t.Errorf("container %s references claim %q that the pod does not define", c.Name, ref.Name)
			}
		}
	}
	// Injecting again must change nothing: the handler is idempotent.
	resp := h.Handle(context.Background(), admissionRequest(t, admissionv1.Create, true, out))
	if !resp.Allowed || len(resp.Patches) != 0 {
		t.Errorf("second pass over the patched pod: allowed %v, patches %v", resp.Allowed, resp.Patches)
	}
}

func TestHandleEnsureFailure(t *testing.T) {
	client := &fakeClient{err: errors.New("resourceclaimtemplates is forbidden")}
	h, err := NewHandler(client)
	if err != nil {
		t.Fatal(err)
	}
	pod := []byte(`{"metadata":{"name":"p","namespace":"ns","annotations":{"gpu.example.com/count":"1"}},"spec":{"containers":[{"name":"app","image":"busybox"}]}}`)
	resp := h.Handle(context.Background(), admissionRequest(t, admissionv1.Create, false, pod))
	if resp.Allowed || resp.Result.Code != 500 || !strings.Contains(resp.Result.Message, "resourceclaimtemplates is forbidden") {
		t.Fatalf("want a 500 naming the cause, got %+v", resp.Result)
	}
	// A failure is not cached: the next pod tries again and, once the API server agrees, works.
	client.err = nil
	resp = h.Handle(context.Background(), admissionRequest(t, admissionv1.Create, false, pod))
	if !resp.Allowed || len(client.templates) != 1 {
		t.Fatalf("after recovery: allowed %v, templates %v", resp.Allowed, client.names())
	}
}

// TestHandlerCacheExpiry: what the handler caches (ensured templates, the validator's verdicts)
// is trusted for cacheTTL and then asked again, so a template deleted behind the webhook's back
// comes back; and the caches stay bounded however many namespaces send pods, keeping the most
// recently used.
func TestHandlerCacheExpiry(t *testing.T) {
	client := &fakeClient{}
	validator := &fakeValidator{warnings: []string{"w"}}
	clk := testingclock.NewFakeClock(time.Unix(0, 0))
	h, err := newHandler(client, clk, WithValidator(validator))
	if err != nil {
		t.Fatal(err)
	}
	podIn := func(ns string) admission.Request {
		return admissionRequest(t, admissionv1.Create, false, []byte(`{"metadata":{"name":"p","namespace":"`+ns+`","annotations":{"gpu.example.com/count":"1"}},"spec":{"containers":[{"name":"app"}]}}`))
	}
	handle := func(ns string, wantEnsures, wantValidations int) {
		t.Helper()
		if resp := h.Handle(context.Background(), podIn(ns)); !resp.Allowed || !slices.Equal(resp.Warnings, []string{"w"}) {
			t.Fatalf("pod in %s: allowed=%t warnings=%q %+v", ns, resp.Allowed, resp.Warnings, resp.Result)
		}
		if client.calls != wantEnsures || len(validator.seen) != wantValidations {
			t.Fatalf("pod in %s: %d ensures and %d validations, want %d and %d", ns, client.calls, len(validator.seen), wantEnsures, wantValidations)
		}
	}
	handle("ns", 1, 1)
	clk.Step(cacheTTL)
	handle("ns", 1, 1) // still trusted at the TTL
	clk.Step(time.Nanosecond)
	handle("ns", 2, 2) // then asked again

	for i := range maxCacheEntries + 10 {
		handle(fmt.Sprintf("ns-%d", i), 3+i, 2)
	}
	if n := len(h.ensured.Keys()); n != maxCacheEntries {
		t.Errorf("%d ensured templates cached, want the bound %d", n, maxCacheEntries)
	}
	last := fmt.Sprintf("ns-%d", maxCacheEntries+9)
	handle(last, client.calls, 2)     // the most recent stays
	handle("ns-0", client.calls+1, 2) // the least recent went first
}

func TestHandleCachesEnsure(t *testing.T) {
	client := &fakeClient{}
	h, err := NewHandler(client)
	if err != nil {
		t.Fatal(err)
	}
	pod := []byte(`{"metadata":{"name":"p","namespace":"ns","annotations":{"gpu.example.com/count":"1"}},"spec":{"containers":[{"name":"app","image":"busybox"}]}}`)
	for range 5 {
		if resp := h.Handle(context.Background(), admissionRequest(t, admissionv1.Create, false, pod)); !resp.Allowed {
			t.Fatalf("denied: %+v", resp.Result)
		}
	}
	if client.calls != 1 {
		t.Errorf("EnsureTemplate called %d times for one template, want 1", client.calls)
	}
	other := []byte(strings.Replace(string(pod), `"namespace":"ns"`, `"namespace":"other"`, 1))
	h.Handle(context.Background(), admissionRequest(t, admissionv1.Create, false, other))
	if client.calls != 2 {
		t.Errorf("a second namespace must get its own template; calls = %d", client.calls)
	}
}

type fakeValidator struct {
	warnings []string
	err      error
	seen     []*resourceapi.ResourceClaimTemplate
}

func (v *fakeValidator) ValidateTemplate(_ context.Context, t *resourceapi.ResourceClaimTemplate) ([]string, error) {
	v.seen = append(v.seen, t)
	return v.warnings, v.err
}

func TestHandleValidator(t *testing.T) {
	pod := []byte(`{"metadata":{"name":"p","namespace":"ns","annotations":{"gpu.example.com/count":"2","gpu.example.com/model":"H100"}},"spec":{"containers":[{"name":"app","image":"busybox"}]}}`)
	for name, tc := range map[string]struct {
		validator   *fakeValidator
		wantAllowed bool
		wantMessage string
		wantWarning []string
	}{
		"warns": {
			validator:   &fakeValidator{warnings: []string{"request gpus: no device currently matches"}},
			wantAllowed: true,
			wantWarning: []string{"request gpus: no device currently matches"},
		},
		"denies": {
			validator:   &fakeValidator{err: errors.New(`spec.spec.devices.requests[0].exactly.count: 2 wanted, best node has 1`)},
			wantMessage: `the GPU request of annotation gpu.example.com/count is not valid: spec.spec.devices.requests[0].exactly.count: 2 wanted, best node has 1`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			client := &fakeClient{}
			h, err := NewHandler(client, WithValidator(tc.validator))
			if err != nil {
				t.Fatal(err)
			}
			resp := h.Handle(context.Background(), admissionRequest(t, admissionv1.Create, false, pod))
			if resp.Allowed != tc.wantAllowed {
				t.Fatalf("allowed %v, want %v: %+v", resp.Allowed, tc.wantAllowed, resp.Result)
			}
			if tc.wantMessage != "" && resp.Result.Message != tc.wantMessage {
				t.Errorf("message %q, want %q", resp.Result.Message, tc.wantMessage)
			}
			if !slices.Equal(resp.Warnings, tc.wantWarning) {
				t.Errorf("warnings %q, want %q", resp.Warnings, tc.wantWarning)
			}
			if len(tc.validator.seen) != 1 || tc.validator.seen[0].Spec.Spec.Devices.Requests[0].Exactly.Count != 2 {
				t.Fatalf("validator saw %v, want the one template", tc.validator.seen)
			}
			if !tc.wantAllowed && client.calls != 0 {
				t.Errorf("a template the validator rejects was created")
			}
		})
	}
}

func TestNewHandlerOptions(t *testing.T) {
	for name, tc := range map[string]struct {
		opts    []Option
		wantErr string
	}{
		"defaults":        {},
		"inventory max":   {opts: []Option{WithMaxDevicesPerNode(16)}},
		"zero max":        {opts: []Option{WithMaxDevicesPerNode(0)}, wantErr: "max devices per node 0: must be at least 1"},
		"bad driver":      {opts: []Option{WithDriverName("GPU_Example")}, wantErr: `driver name "GPU_Example"`},
		"other driver ok": {opts: []Option{WithDriverName("gpu.acme.io")}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewHandler(&fakeClient{}, tc.opts...)
			if tc.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	if _, err := NewHandler(nil); err == nil {
		t.Error("a nil client must be refused")
	}
}
