package podinject

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fakeCluster serves what a case says the cluster serves.
type fakeCluster struct {
	Served          []corev1.ResourceName          `json:"served,omitempty"`
	DevicePlugin    map[corev1.ResourceName]string `json:"devicePlugin,omitempty"`
	PrioritizedList bool                           `json:"prioritizedList,omitempty"`
	ProbeError      string                         `json:"probeError,omitempty"`
	// SharedMemory: consumable capacity served and shared-memory GPUs published.
	SharedMemory bool `json:"sharedMemory,omitempty"`
}

func (f *fakeCluster) SharesMemory(context.Context) (bool, error) {
	if f.ProbeError != "" {
		return false, errors.New(f.ProbeError)
	}
	return f.SharedMemory, nil
}

func (f *fakeCluster) ServesExtendedResource(_ context.Context, name corev1.ResourceName, _ string) bool {
	return slices.Contains(f.Served, name)
}

func (f *fakeCluster) DevicePluginNode(name corev1.ResourceName) string { return f.DevicePlugin[name] }

func (f *fakeCluster) ServesPrioritizedList(context.Context) (bool, error) {
	if f.ProbeError != "" {
		return false, errors.New(f.ProbeError)
	}
	return f.PrioritizedList, nil
}

// clusterCase is a case of testdata/extended-cases.yaml or models-cases.yaml: a handlerCase on a
// cluster that serves what Cluster says, with the chart's classes (default: the chart's default).
type clusterCase struct {
	handlerCase
	Cluster fakeCluster   `json:"cluster"`
	Classes []DeviceClass `json:"classes,omitempty"`
}

// chartDefault is what the chart's default values pass: one class with <driver>/gpu.
var chartDefault = []DeviceClass{{Name: "gpu.example.com", ExtendedResourceName: "gpu.example.com/gpu"}}

func runClusterCases(t *testing.T, path string) {
	for _, tc := range loadCases[clusterCase](t, path) {
		classes := tc.Classes
		if classes == nil {
			classes = chartDefault
		}
		runCase(t, tc.handlerCase, checkTranslatedPod, WithDeviceClasses(classes...), WithCluster(&tc.Cluster))
	}
}

// TestHandleExtended: containers' limits of the classes' resource names, on clusters that serve
// them (the pod passes untouched) and that do not (they become a claim and leave the pod).
func TestHandleExtended(t *testing.T) { runClusterCases(t, "testdata/extended-cases.yaml") }

// TestHandleModels: a model annotation listing several models, on clusters with and without
// firstAvailable.
func TestHandleModels(t *testing.T) { runClusterCases(t, "testdata/models-cases.yaml") }

func TestHandleMemory(t *testing.T) { runClusterCases(t, "testdata/memory-cases.yaml") }

// checkTranslatedPod: the patched pod asks for no class resource any more, every container
// reference names a claim of the pod, and a second pass changes nothing.
func checkTranslatedPod(t *testing.T, h *Handler, podJSON, patchJSON []byte) {
	t.Helper()
	patch, err := jsonpatch.DecodePatch(patchJSON)
	if err != nil {
		t.Fatalf("decode patch: %v", err)
	}
	out, err := patch.Apply(podJSON)
	if err != nil {
		t.Fatalf("apply patch: %v", err)
	}
	var after corev1.Pod
	if err := json.Unmarshal(out, &after); err != nil {
		t.Fatalf("patched pod: %v", err)
	}
	claims := map[string]bool{}
	for _, rc := range after.Spec.ResourceClaims {
		claims[rc.Name] = true
	}
	for _, c := range slices.Concat(after.Spec.InitContainers, after.Spec.Containers) {
		for _, ref := range c.Resources.Claims {
			if !claims[ref.Name] {
				t.Errorf("container %s references claim %q that the pod does not define", c.Name, ref.Name)
			}
		}
		for name := range c.Resources.Limits {
			if _, ours := h.opts.classOf[name]; ours && h.opts.cluster != nil && !h.opts.cluster.ServesExtendedResource(context.Background(), name, "") && h.opts.cluster.DevicePluginNode(name) == "" {
				t.Errorf("container %s still asks for %s", c.Name, name)
			}
		}
	}
	resp := h.Handle(context.Background(), admissionRequest(t, admissionv1.Create, true, out))
	if !resp.Allowed || len(resp.Patches) != 0 {
		t.Errorf("second pass over the patched pod: allowed %v, patches %v", resp.Allowed, resp.Patches)
	}
}

// TestPlanExtended pins the requests and container references, which follow the scheduler's own
// claims for extended resources: one request per long-lived container and name; init containers
// borrow what long-lived containers after them hold and share one request for the rest.
func TestPlanExtended(t *testing.T) {
	const gpu, other = corev1.ResourceName("gpu.example.com/gpu"), corev1.ResourceName("example.com/gpu")
	app := func(container int, name corev1.ResourceName, count int64) extendedUse {
		return extendedUse{container: container, name: name, class: "c-" + string(name[:3]), count: count, longLived: true}
	}
	init := func(container int, count int64) extendedUse {
		return extendedUse{container: container, name: gpu, class: "c-gpu", count: count}
	}
	for _, tc := range []struct {
		name     string
		uses     []extendedUse
		requests []string // name=count
		refs     map[int][]string
	}{
		{name: "one container", uses: []extendedUse{app(0, gpu, 2)},
			requests: []string{"container-0-request-0=2"}, refs: map[int][]string{0: {"container-0-request-0"}}},
		{name: "two containers", uses: []extendedUse{app(0, gpu, 1), app(1, gpu, 3)},
			requests: []string{"container-0-request-0=1", "container-1-request-0=3"},
			refs:     map[int][]string{0: {"container-0-request-0"}, 1: {"container-1-request-0"}}},
		{name: "two names in one container, numbered in name order", uses: []extendedUse{app(0, gpu, 1), app(0, other, 2)},
			requests: []string{"container-0-request-0=2", "container-0-request-1=1"},
			refs:     map[int][]string{0: {"container-0-request-0", "container-0-request-1"}}},
		{name: "init container borrows the app's devices", uses: []extendedUse{init(0, 1), app(1, gpu, 2)},
			requests: []string{"container-1-request-0=2"},
			refs:     map[int][]string{0: {"container-1-request-0"}, 1: {"container-1-request-0"}}},
		{name: "init container needs more than the app holds", uses: []extendedUse{init(0, 3), app(1, gpu, 2)},
			requests: []string{"container-0-request-0=1", "container-1-request-0=2"},
			refs:     map[int][]string{0: {"container-1-request-0", "container-0-request-0"}, 1: {"container-1-request-0"}}},
		{name: "init containers share the largest request", uses: []extendedUse{init(0, 2), init(1, 4)},
			requests: []string{"container-1-request-0=4"},
			refs:     map[int][]string{0: {"container-1-request-0"}, 1: {"container-1-request-0"}}},
		{name: "a sidecar keeps its own", uses: []extendedUse{{container: 0, name: gpu, class: "c-gpu", count: 1, longLived: true}, app(1, gpu, 1)},
			requests: []string{"container-0-request-0=1", "container-1-request-0=1"},
			refs:     map[int][]string{0: {"container-0-request-0"}, 1: {"container-1-request-0"}}},
		{name: "an init container borrows only from containers after it", uses: []extendedUse{{container: 0, name: gpu, class: "c-gpu", count: 2, longLived: true}, init(1, 1)},
			requests: []string{"container-0-request-0=2", "container-1-request-0=1"},
			refs:     map[int][]string{0: {"container-0-request-0"}, 1: {"container-1-request-0"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := planExtended(tc.uses)
			var got []string
			for _, r := range p.requests {
				got = append(got, r.Name+"="+itoa(r.Exactly.Count))
				if r.Exactly.AllocationMode != resourceapi.DeviceAllocationModeExactCount || !strings.HasPrefix(r.Exactly.DeviceClassName, "c-") {
					t.Errorf("request %s: %+v", r.Name, r.Exactly)
				}
			}
			if !slices.Equal(got, tc.requests) {
				t.Errorf("requests = %v, want %v", got, tc.requests)
			}
			for c, want := range tc.refs {
				if !slices.Equal(p.byContainer[c], want) {
					t.Errorf("container %d references %v, want %v", c, p.byContainer[c], want)
				}
			}
			if len(p.byContainer) != len(tc.refs) {
				t.Errorf("references of %d containers, want %d: %v", len(p.byContainer), len(tc.refs), p.byContainer)
			}
		})
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

func TestValidateExtendedResourceName(t *testing.T) {
	for name, ok := range map[corev1.ResourceName]bool{
		"gpu.example.com/gpu":   true,
		"example.com/gpu":       true,
		"example.com/GPU_1.x":   true,
		"gpu":                   false, // no domain
		"kubernetes.io/gpu":     false,
		"foo.kubernetes.io/gpu": false,
		"deviceclass.resource.kubernetes.io/gpu.example.com": false,
		"requests.example.com/gpu":                           false,
		"Example.com/gpu":                                    false,
		"example.com/":                                       false,
		"example.com/" + corev1.ResourceName(strings.Repeat("g", 64)): false,
	} {
		if err := ValidateExtendedResourceName(name); (err == nil) != ok {
			t.Errorf("ValidateExtendedResourceName(%q) = %v, want ok %v", name, err, ok)
		}
	}
}

// TestExtendedQuantities: both decoders keep exactly the entries with a domain, as written.
func TestExtendedQuantities(t *testing.T) {
	for _, tc := range []struct {
		json string
		want extendedQuantities
	}{
		{`{"cpu":"1","memory":"100Mi"}`, nil},
		{`{"cpu":"1","gpu.example.com/gpu":"2"}`, extendedQuantities{{name: "gpu.example.com/gpu", value: "2", quantity: true}}},
		{`{"gpu.example.com\/gpu":2}`, extendedQuantities{{name: "gpu.example.com/gpu", value: "2", quantity: true}}},
		{`{"b.com/x":"-1","a.com/y":0.5}`, extendedQuantities{{name: "a.com/y", value: "0.5", quantity: true}, {name: "b.com/x", value: "-1", quantity: true}}},
		{`{"a.com/x":true}`, extendedQuantities{{name: "a.com/x", value: "true"}}},
		{`null`, nil},
		{`"a/b"`, nil},
	} {
		t.Run(tc.json, func(t *testing.T) {
			for _, decoder := range []string{"decodePod", "decodeReview"} {
				raw := `{"spec":{"containers":[{"name":"c","resources":{"limits":` + tc.json + `}}]}}`
				var pod *podView
				var err error
				if decoder == "decodePod" {
					pod, err = decodePod([]byte(raw))
				} else {
					var review *podReview
					review, err = decodeReview([]byte(`{"request":{"object":` + raw + `}}`))
					if err == nil {
						pod = review.Request.Object
					}
				}
				if err != nil {
					t.Fatalf("%s: %v", decoder, err)
				}
				if got := pod.Spec.Containers[0].Resources.Limits; !slices.Equal(got, tc.want) {
					t.Errorf("%s: %+v, want %+v", decoder, got, tc.want)
				}
			}
		})
	}
}

func TestParseModels(t *testing.T) {
	for _, tc := range []struct {
		value   string
		want    []string
		wantErr string
	}{
		{value: "A100,LATEST-GPU-MODEL", want: []string{"A100", "LATEST-GPU-MODEL"}},
		{value: " A100 ,\tH100 ", want: []string{"A100", "H100"}},
		{value: "Ä100,ＧＰＵ,🚀", want: []string{"Ä100", "ＧＰＵ", "🚀"}},
		{value: "1,2,3,4,5,6,7,8", want: []string{"1", "2", "3", "4", "5", "6", "7", "8"}},
		{value: "1,2,3,4,5,6,7,8,9", wantErr: "lists 9 models, and a request tries at most 8 in turn"},
		{value: strings.Repeat(",", 100000), wantErr: "lists 100001 models"},
		{value: "A100,", wantErr: "model 2 of the list is empty"},
		{value: ",A100", wantErr: "model 1 of the list is empty"},
		{value: "A100, ,B", wantErr: "model 2 of the list is empty"},
		{value: "A100,A100", wantErr: `model "A100" is listed twice`},
		{value: "A100, A100 ", wantErr: `model "A100" is listed twice`},
		{value: "A100," + strings.Repeat("x", 65), wantErr: "model 2 is longer than 64 bytes"},
	} {
		t.Run(tc.value, func(t *testing.T) {
			got, errs := parseModels("gpu.example.com/model", tc.value)
			if tc.wantErr != "" {
				if len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), tc.wantErr) {
					t.Fatalf("errors %v, want one saying %q", errs, tc.wantErr)
				}
				if got != nil {
					t.Errorf("models %q returned with errors", got)
				}
				for _, e := range errs {
					if e.Field != "metadata.annotations[gpu.example.com/model]" || len(e.Error()) > 512 {
						t.Errorf("error %.200q: field %s, %d bytes", e.Error(), e.Field, len(e.Error()))
					}
				}
				return
			}
			if len(errs) > 0 || !slices.Equal(got, tc.want) {
				t.Errorf("parseModels = %q, %v; want %q", got, errs, tc.want)
			}
		})
	}
}

// FuzzExtended sends a container's limit and request of the class's extended resource, as any
// strings (and numbers), through both servings of the handler on a cluster that does not serve
// extended resources. Neither may panic and both must agree; an accepted pod asks for 1..8 GPUs,
// loses the resource and references the claim; a denied one is told which field, briefly.
// Seeds: testdata/fuzz/FuzzExtended. Run: go test -fuzz=FuzzExtended ./webhook/podinject
func FuzzExtended(f *testing.F) {
	f.Add("2", "", false)
	h, err := NewHandler(&fakeClient{}, WithDeviceClasses(chartDefault...), WithCluster(&fakeCluster{}))
	if err != nil {
		f.Fatal(err)
	}
	served := servers(h)
	f.Fuzz(func(t *testing.T, limit, request string, annotated bool) {
		quote := func(s string) string {
			// A number stays a JSON number, as a client may send it; anything else is a string.
			if json.Valid([]byte(s)) && len(s) > 0 && (s[0] == '-' || s[0] >= '0' && s[0] <= '9') {
				return s
			}
			b, _ := json.Marshal(s)
			return string(b)
		}
		resources := `"limits":{"gpu.example.com/gpu":` + quote(limit) + `}`
		if request != "" {
			resources += `,"requests":{"gpu.example.com/gpu":` + quote(request) + `}`
		}
		annotations := ""
		if annotated {
			annotations = `,"annotations":{"gpu.example.com/count":"1"}`
		}
		raw := []byte(`{"metadata":{"name":"p","namespace":"ns"` + annotations + `},"spec":{"containers":[{"name":"app","resources":{` + resources + `}}]}}`)
		req := admissionRequestRaw(admissionv1.Create, raw)
		want := review(t, served["admission.Webhook"], admissionv1.SchemeGroupVersion.String(), req)
		got := review(t, served["ServeHTTP"], admissionv1.SchemeGroupVersion.String(), req)
		if got.Allowed != want.Allowed || string(got.Patch) != string(want.Patch) {
			t.Fatalf("ServeHTTP allowed=%v patch %s, admission.Webhook allowed=%v patch %s", got.Allowed, got.Patch, want.Allowed, want.Patch)
		}
		if !got.Allowed {
			msg := got.Result.Message
			if !strings.Contains(msg, "spec.containers[0].resources.") || len(msg) > 1024 {
				t.Fatalf("denial %.300q does not name the container's resource briefly (%d bytes)", msg, len(msg))
			}
			return
		}
		if annotated {
			t.Fatalf("limit %q with the annotation admitted", limit)
		}
		var ops []struct {
			Op, Path string
			Value    json.RawMessage
		}
		if err := json.Unmarshal(got.Patch, &ops); err != nil || len(ops) == 0 {
			t.Fatalf("limit %q admitted without a patch: %s (%v)", limit, got.Patch, err)
		}
		removed := false
		for _, op := range ops {
			removed = removed || op.Op == "remove" && op.Path == "/spec/containers/0/resources/limits/gpu.example.com~1gpu"
		}
		if !removed {
			t.Fatalf("limit %q admitted but left in the pod: %s", limit, got.Patch)
		}
		p, err := decodePod(raw)
		if err != nil {
			t.Fatal(err)
		}
		uses, errs := h.opts.extendedUses(p, func(corev1.ResourceName, string) bool { return true })
		if len(errs) > 0 || len(uses) != 1 || uses[0].count < 1 || uses[0].count > int64(h.opts.countLimit()) {
			t.Fatalf("limit %q request %q admitted as %+v (%v)", limit, request, uses, errs)
		}
	})
}

// testExtended: on a real API server (one that does not serve extended resources through DRA, as
// the handler is told by default), a pod asking in its limits is stored with the claim instead,
// the template exists in the served version, and the API server's own validation of the patched
// pod holds: no extended resource left, requests no greater than limits.
func (e *env) testExtended(t *testing.T) {
	ns := e.namespace(t, "extended")
	pod := gpuPod("limits", nil, "app", "sidecar")
	two := resource.MustParse("2")
	pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"gpu.example.com/gpu": two, corev1.ResourceCPU: resource.MustParse("1")}
	pod.Spec.InitContainers[0].Resources.Limits = corev1.ResourceList{"gpu.example.com/gpu": resource.MustParse("1")}
	got := e.createPod(t, ns, pod, metav1.CreateOptions{})
	template := ""
	for _, rc := range got.Spec.ResourceClaims {
		if rc.Name == ClaimName && rc.ResourceClaimTemplateName != nil {
			template = *rc.ResourceClaimTemplateName
		}
	}
	for _, c := range slices.Concat(got.Spec.InitContainers, got.Spec.Containers) {
		for name := range c.Resources.Limits {
			if strings.Contains(string(name), "gpu") {
				t.Errorf("container %s still asks for %s", c.Name, name)
			}
		}
		if c.Name == "sidecar" && len(c.Resources.Claims) > 0 {
			t.Errorf("container %s without GPU limits got claims %v", c.Name, c.Resources.Claims)
		}
	}
	if cpu := got.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU]; cpu.String() != "1" {
		t.Errorf("the cpu limit was touched: %v", got.Spec.Containers[0].Resources.Limits)
	}
	if refs := got.Spec.Containers[0].Resources.Claims; len(refs) != 1 || refs[0].Request != "container-1-request-0" {
		t.Errorf("app container references %v", refs)
	}
	if refs := got.Spec.InitContainers[0].Resources.Claims; len(refs) != 1 || refs[0].Request != "container-1-request-0" {
		t.Errorf("init container references %v, want the app's request it runs before", refs)
	}
	tmpl, err := e.templates.ResourceClaimTemplates(ns).Get(context.Background(), template, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("template %q of the pod: %v", template, err)
	}
	if r := tmpl.Spec.Spec.Devices.Requests; len(r) != 1 || r[0].Exactly == nil || r[0].Exactly.Count != 2 || r[0].Exactly.DeviceClassName != "gpu.example.com" {
		t.Errorf("template requests %+v, want 2 GPUs of gpu.example.com", r)
	}

	// A bad value is refused by the webhook with the field, not later by the scheduler (the API
	// server itself accepts fractions of the implicit name).
	bad := gpuPod("zero", nil, "app")
	bad.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"deviceclass.resource.kubernetes.io/gpu.example.com": resource.MustParse("500m")}
	_, err = e.cs.CoreV1().Pods(ns).Create(context.Background(), bad, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "spec.containers[0].resources.limits[deviceclass.resource.kubernetes.io/gpu.example.com]") {
		t.Errorf("half a GPU: %v, want the webhook's denial naming the field", err)
	}
}

// TestExtendedHostile: a forged pod with a thousand containers, each asking in its limits next to
// other names, is answered quickly, whichever way.
func TestExtendedHostile(t *testing.T) {
	h, err := NewHandler(&fakeClient{}, WithDeviceClasses(chartDefault...), WithCluster(&fakeCluster{}))
	if err != nil {
		t.Fatal(err)
	}
	var other strings.Builder
	container := func(i int, value string) string {
		return fmt.Sprintf(`{"name":"c%d","resources":{"limits":{%s"gpu.example.com/gpu":%q}}}`, i, other.String(), value)
	}
	for i := range 20 {
		fmt.Fprintf(&other, `"x%d.example.com/gpu":"1",`, i)
	}
	for _, tc := range []struct{ name, init, app string }{
		{"bad values", "-1", "0"},
		{"init containers", "1", "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var inits, apps []string
			for i := range 1000 {
				inits = append(inits, container(i, tc.init))
			}
			apps = append(apps, container(0, tc.app))
			raw := []byte(`{"metadata":{"name":"p","namespace":"ns"},"spec":{"initContainers":[` + strings.Join(inits, ",") + `],"containers":[` + strings.Join(apps, ",") + `]}}`)
			start := time.Now()
			resp := review(t, servers(h)["ServeHTTP"], admissionv1.SchemeGroupVersion.String(), admissionRequestRaw(admissionv1.Create, raw))
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("answered a %d KB pod in %s", len(raw)>>10, d)
			}
			t.Logf("%d KB pod answered in %s: allowed %v, %d bytes of patch", len(raw)>>10, time.Since(start).Round(time.Millisecond), resp.Allowed, len(resp.Patch))
		})
	}
}
