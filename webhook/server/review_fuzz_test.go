package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/allocs"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/webhook/podinject"
)

// reviewBudget is what one review may allocate: a constant for the handlers' own work and a
// multiple of the review's size for decoding it (the AdmissionReview, the object, its copies and
// the answer). Ordinary pod and claim reviews over the fuzz inventory allocate well under 1 MiB
// (the feasibility check runs the allocator over a few nodes); a value parsed without a bound
// costs tens of MiB ("1e-5000000": 24 MiB, and a second) or more, so the budget tells the two
// apart while leaving room for a selector the CEL compiler works hard on.
const (
	reviewBudget        = 8 << 20
	reviewBudgetPerByte = 64
)

// reviewer is the webhook's handlers, wired as Setup wires them, over a fake clientset holding a
// small fixed inventory: a node of exclusive GPUs, one of shared-memory GPUs, and one whose plugin
// publishes as its model a string that quantity() would parse for a second per device.
type reviewer struct {
	routes map[string]http.Handler
}

var (
	fuzzReviewer     *reviewer
	fuzzReviewerOnce sync.Once
	fuzzReviewerErr  error
)

func newReviewer() (*reviewer, error) {
	ctx := context.Background()
	var objs []kruntime.Object
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.example.com"}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}}}}
	objs = append(objs, class, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}})
	for _, n := range []struct {
		name    string
		spec    nodegroups.GroupSpec
		hostile bool
	}{
		{name: "exclusive", spec: nodegroups.GroupSpec{Count: 4}},
		{name: "shared", spec: nodegroups.GroupSpec{Count: 2, Sharing: &nodegroups.Sharing{Mode: nodegroups.SharedMemory}}},
		{name: "hostile", spec: nodegroups.GroupSpec{Count: 2}, hostile: true},
	} {
		devices, err := simulated.New(n.name, n.spec).Devices(ctx)
		if err != nil {
			return nil, err
		}
		if n.hostile {
			for i := range devices {
				devices[i].Attributes[deviceschema.AttrModel] = resourceapi.DeviceAttribute{StringValue: ptr.To("1e-5000000")}
			}
		}
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: n.name + "-gpu.example.com"},
			Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.example.com", NodeName: ptr.To(n.name),
				Pool: resourceapi.ResourcePool{Name: n.name, ResourceSliceCount: 1}, Devices: devices},
		})
	}
	cs := fake.NewClientset(objs...)
	o := NewOptions()
	o.Namespace = "gpu-dra"
	o.DeviceClasses = []podinject.DeviceClass{{Name: "gpu.example.com", ExtendedResourceName: "gpu.example.com/gpu"}}
	h, err := newHandlers(cs, o, &nodegroups.Config{})
	if err != nil {
		return nil, err
	}
	// The handlers serve for the life of the test binary, as they do for the webhook's.
	go h.run(ctx)
	go h.templates.Run(ctx)
	synced, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(synced.Done(), h.informers.HasSynced, h.claims.HasSynced, h.templates.HasSynced) {
		return nil, fmt.Errorf("informers did not sync")
	}
	return &reviewer{routes: h.routes()}, nil
}

// reviewInput is one fuzzed review: a pod (annotations, limits) or a claim or template (a
// selector, a capacity request, opaque parameters).
type reviewInput struct {
	kind                           uint8
	count, memory, model, limit    string
	selector, capacity, parameters string
}

// body is the AdmissionReview the API server would send for in, and the path it goes to.
func (in reviewInput) body() (string, []byte, error) {
	req := admissionv1.AdmissionRequest{UID: "fuzz", Namespace: "ns", Name: "r", Operation: admissionv1.Create, DryRun: ptr.To(false)}
	var obj map[string]any
	path := ValidateClaimPath
	switch in.kind % 3 {
	case 0:
		path = podinject.Path
		annotations := map[string]string{}
		for key, v := range map[string]string{"count": in.count, "memory": in.memory, "model": in.model} {
			if v != "" {
				annotations["gpu.example.com/"+key] = v
			}
		}
		container := map[string]any{"name": "app", "image": "busybox"}
		if in.limit != "" {
			container["resources"] = map[string]any{"limits": map[string]any{"gpu.example.com/gpu": in.limit}}
		}
		obj = map[string]any{"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": "r", "namespace": "ns", "annotations": annotations},
			"spec":     map[string]any{"containers": []any{container}}}
		req.Kind = metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}
		req.Resource = metav1.GroupVersionResource{Version: "v1", Resource: "pods"}
	default:
		exactly := map[string]any{"deviceClassName": "gpu.example.com"}
		if in.selector != "" {
			exactly["selectors"] = []any{map[string]any{"cel": map[string]any{"expression": in.selector}}}
		}
		if in.capacity != "" {
			exactly["capacity"] = map[string]any{"requests": map[string]any{"memory": in.capacity}}
		}
		spec := map[string]any{"devices": map[string]any{"requests": []any{map[string]any{"name": "gpu", "exactly": exactly}}}}
		if in.parameters != "" {
			params := json.RawMessage(in.parameters)
			if !json.Valid(params) {
				params, _ = json.Marshal(map[string]string{"raw": in.parameters})
			}
			spec["devices"].(map[string]any)["config"] = []any{map[string]any{"opaque": map[string]any{"driver": "gpu.example.com", "parameters": params}}}
		}
		kind, resource := "ResourceClaim", "resourceclaims"
		if in.kind%3 == 2 {
			kind, resource, spec = "ResourceClaimTemplate", "resourceclaimtemplates", map[string]any{"spec": spec}
		}
		obj = map[string]any{"apiVersion": "resource.k8s.io/v1", "kind": kind,
			"metadata": map[string]any{"name": "r", "namespace": "ns"}, "spec": spec}
		req.Kind = metav1.GroupVersionKind{Group: "resource.k8s.io", Version: "v1", Kind: kind}
		req.Resource = metav1.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: resource}
	}
	raw, err := json.Marshal(obj)
	if err != nil {
		return "", nil, err
	}
	req.Object = kruntime.RawExtension{Raw: raw}
	body, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: &req})
	return path, body, err
}

// review sends body to the handler at path and returns the answer and the bytes allocated
// meanwhile (deterministic, unlike the time taken).
func (r *reviewer) review(path string, body []byte) (*admissionv1.AdmissionResponse, uint64, error) {
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	allocated := allocs.Bytes(func() { r.routes[path].ServeHTTP(w, req) })
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Response == nil {
		return nil, 0, fmt.Errorf("status %d, answer %.300q: not an AdmissionReview response (%v)", w.Code, w.Body.String(), err)
	}
	return out.Response, allocated, nil
}

// FuzzReview drives whole pod, claim and template reviews through the webhook's handlers and
// holds every review to a budget in allocated bytes: whatever a client sends, one review's cost
// is bounded. The seed corpus (testdata/fuzz/FuzzReview) holds the inputs that broke that bound.
func FuzzReview(f *testing.F) {
	f.Add(uint8(0), "1", "40Gi", "LATEST-GPU-MODEL", "", "", "", "")
	f.Add(uint8(0), "", "", "", "2", "", "", "")
	f.Add(uint8(1), "", "", "", "", `device.attributes["gpu.example.com"].model == "LATEST-GPU-MODEL"`, "", "")
	f.Add(uint8(1), "", "", "", "", "", "10Gi", `{"apiVersion":"gpu.example.com/v1alpha1","kind":"GpuConfig"}`)
	f.Add(uint8(2), "", "", "", "", `device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("10Gi"))`, "", "")
	fuzzReviewerOnce.Do(func() { fuzzReviewer, fuzzReviewerErr = newReviewer() })
	if fuzzReviewerErr != nil {
		f.Fatal(fuzzReviewerErr)
	}
	r := fuzzReviewer
	// The first review of each kind builds what every later one shares (the CEL environment, the
	// view of the inventory): not a review's own cost.
	for _, in := range []reviewInput{{kind: 0, count: "1"}, {kind: 1, selector: "true", capacity: "1Gi"}, {kind: 2}} {
		path, body, err := in.body()
		if err != nil {
			f.Fatal(err)
		}
		if _, _, err := r.review(path, body); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, kind uint8, count, memory, model, limit, selector, capacity, parameters string) {
		in := reviewInput{kind: kind, count: count, memory: memory, model: model, limit: limit, selector: selector, capacity: capacity, parameters: parameters}
		path, body, err := in.body()
		if err != nil {
			t.Skip("not a review a client can send:", err)
		}
		resp, allocated, err := r.review(path, body)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d bytes of review, %d allocated; allowed %t: %.200s", path, len(body), allocated, resp.Allowed, resultMessage(resp))
		if budget := reviewBudget + reviewBudgetPerByte*uint64(len(body)); allocated > budget {
			t.Fatalf("a review of %d bytes allocated %d bytes, over its budget of %d (allowed %t: %.300s)", len(body), allocated, budget, resp.Allowed, resultMessage(resp))
		}
	})
}

func resultMessage(r *admissionv1.AdmissionResponse) string {
	if r.Result == nil {
		return ""
	}
	return r.Result.Message
}
