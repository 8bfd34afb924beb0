package podinject

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// annotatedPod is a pod in ns asking for count GPUs of model ("" for any).
func annotatedPod(t testing.TB, ns string, count int, model string) []byte {
	t.Helper()
	ann := fmt.Sprintf(`"gpu.example.com/count":"%d"`, count)
	if model != "" {
		ann += fmt.Sprintf(`,"gpu.example.com/model":%q`, model)
	}
	return []byte(`{"metadata":{"name":"p","namespace":"` + ns + `","annotations":{` + ann + `}},"spec":{"containers":[{"name":"app"}]}}`)
}

// clusterHandler is the handler as the webhook wires it: the API client watching the managed
// templates, deletions forgotten.
func clusterHandler(t testing.TB, cs kubernetes.Interface, clientOpts []ClientOption, opts ...Option) *Handler {
	t.Helper()
	c := NewAPIClient(cs, clientOpts...)
	h, err := NewHandler(c, append([]Option{WithMaxDevicesPerNode(8)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	c.OnDelete(h.Forget)
	runAPIClient(t, c)
	return h
}

// checkCapturedTemplate: a template someone else created under a managed name and label, with
// another spec, is not used: the pod is denied naming the template and the fix, nothing about it
// is remembered, and once it is deleted the webhook creates the right one. Shared by the unit test
// (fake clientset) and the integration test (real API server, every served version).
func checkCapturedTemplate(t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	ctx := context.Background()
	h := clusterHandler(t, cs, nil)
	want := testTemplate(t, ns)
	impostor := want.DeepCopy()
	impostor.Spec.Spec.Devices.Requests[0].Exactly.Count = 1
	impostor.Spec.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: "true"}}}
	templates := NewAPIClient(cs).templates(ns)
	if _, err := templates.Create(ctx, impostor, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantMsg := fmt.Sprintf("ResourceClaimTemplate %s/%s is labelled app.kubernetes.io/managed-by=gpu-dra but its spec is not the one the webhook writes for this request, so pods must not use it; delete it (kubectl -n %s delete resourceclaimtemplate %s) and the webhook creates it again", ns, want.Name, ns, want.Name)
	pod := admissionRequest(t, admissionv1.Create, false, annotatedPod(t, ns, 2, ""))
	// Twice: a refusal is not remembered as a template ensured.
	for range 2 {
		resp := h.Handle(ctx, pod)
		if resp.Allowed || resp.Result.Code != http.StatusForbidden || resp.Result.Message != wantMsg {
			t.Fatalf("pod with an impostor template: allowed=%t %+v\nwant denied: %s", resp.Allowed, resp.Result, wantMsg)
		}
	}
	if err := templates.(interface {
		Delete(context.Context, string, metav1.DeleteOptions) error
	}).Delete(ctx, want.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pod injected once the impostor is gone", func() bool {
		return h.Handle(ctx, pod).Allowed
	})
	got, err := templates.Get(ctx, want.Name, metav1.GetOptions{})
	if err != nil || got.Spec.Spec.Devices.Requests[0].Exactly.Count != 2 || len(got.Spec.Spec.Devices.Requests[0].Exactly.Selectors) != 0 {
		t.Errorf("template after the impostor: %+v (%v)", got, err)
	}
}

func TestCapturedTemplate(t *testing.T) { checkCapturedTemplate(t, fake.NewClientset(), "ns") }

// checkDeletedTemplateComesBack: a managed template deleted behind the webhook's back is created
// again for the next pod, not a minute later when a cache entry expires.
func checkDeletedTemplateComesBack(t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	ctx := context.Background()
	h := clusterHandler(t, cs, nil)
	pod := admissionRequest(t, admissionv1.Create, false, annotatedPod(t, ns, 2, ""))
	if resp := h.Handle(ctx, pod); !resp.Allowed {
		t.Fatalf("denied: %+v", resp.Result)
	}
	name := testTemplate(t, ns).Name
	templates := NewAPIClient(cs).templates(ns).(interface {
		templateInterface
		Delete(context.Context, string, metav1.DeleteOptions) error
	})
	if err := templates.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deleted template created again for the next pod", func() bool {
		if resp := h.Handle(ctx, pod); !resp.Allowed {
			t.Fatalf("denied: %+v", resp.Result)
		}
		_, err := templates.Get(ctx, name, metav1.GetOptions{})
		return err == nil
	})
}

func TestDeletedTemplateComesBack(t *testing.T) {
	checkDeletedTemplateComesBack(t, fake.NewClientset(), "ns")
}

// TestTemplatesPerNamespaceBound: each distinct model string used to create another template; a
// namespace now gets at most the bound, counted from what the cluster holds (so it survives a
// restart) plus the creations on their way, and a pod that would need one more is denied.
func TestTemplatesPerNamespaceBound(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	h := clusterHandler(t, cs, []ClientOption{WithMaxTemplatesPerNamespace(3)})
	handle := func(ns string, count int, model string) *admissionv1.AdmissionResponse {
		resp := h.Handle(ctx, admissionRequest(t, admissionv1.Create, false, annotatedPod(t, ns, count, model)))
		return &resp.AdmissionResponse
	}
	// Concurrent pods, ten distinct models: exactly three get a template.
	var wg sync.WaitGroup
	results := make([]*admissionv1.AdmissionResponse, 10)
	for i := range results {
		wg.Go(func() { results[i] = handle("burst", 1, fmt.Sprintf("MODEL-%d", i)) })
	}
	wg.Wait()
	admitted := 0
	wantMsg := "namespace burst has 3 ResourceClaimTemplates managed by gpu-dra, the most the webhook creates in one namespace (each distinct count, model and memory annotation needs its own); ask for GPUs the way existing pods do, or delete templates no pod uses (kubectl -n burst get resourceclaimtemplates -l app.kubernetes.io/managed-by=gpu-dra)"
	for _, r := range results {
		switch {
		case r.Allowed:
			admitted++
		case r.Result.Code != http.StatusForbidden || r.Result.Message != wantMsg:
			t.Errorf("denied with %+v\nwant: %s", r.Result, wantMsg)
		}
	}
	list, err := cs.ResourceV1().ResourceClaimTemplates("burst").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if admitted != 3 || len(list.Items) != 3 {
		t.Fatalf("%d pods admitted, %d templates created; want 3 and 3", admitted, len(list.Items))
	}
	// A template that exists serves every further pod; another namespace has its own bound.
	var existing string
	for i, r := range results {
		if r.Allowed {
			existing = fmt.Sprintf("MODEL-%d", i)
			break
		}
	}
	if r := handle("burst", 1, existing); !r.Allowed {
		t.Errorf("a pod asking what an existing template gives: %+v", r.Result)
	}
	if r := handle("other", 1, "MODEL-X"); !r.Allowed {
		t.Errorf("another namespace: %+v", r.Result)
	}
	// Deleting one makes room.
	if err := cs.ResourceV1().ResourceClaimTemplates("burst").Delete(ctx, list.Items[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "room for a new template after a deletion", func() bool { return handle("burst", 2, "").Allowed })
}

// TestSharedCreationOwnContexts: pods asking for the same template share one creation, and each
// waits only as long as its own context allows: the first one giving up (its review timed out)
// must not fail the others. It used to hand them its context's error.
func TestSharedCreationOwnContexts(t *testing.T) {
	client := &blockingClient{started: make(chan struct{}), release: make(chan struct{})}
	h, err := NewHandler(client)
	if err != nil {
		t.Fatal(err)
	}
	pod := admissionRequest(t, admissionv1.Create, false, annotatedPod(t, "ns", 1, ""))
	first, cancelFirst := context.WithCancel(context.Background())
	firstDone := make(chan admission.Response, 1)
	go func() { firstDone <- h.Handle(first, pod) }()
	<-client.started
	secondDone := make(chan admission.Response, 1)
	go func() { secondDone <- h.Handle(context.Background(), pod) }()
	// Let the second pod join the creation in flight (if it has not by then, it waits for a
	// creation of its own, which the client holds as well: the outcome must be the same).
	time.Sleep(200 * time.Millisecond)
	cancelFirst()
	if r := <-firstDone; r.Allowed || r.Result.Code != http.StatusRequestTimeout {
		t.Errorf("the pod that gave up: allowed=%t %+v, want a 408", r.Allowed, r.Result)
	}
	close(client.release)
	if r := <-secondDone; !r.Allowed || len(r.Patches) == 0 {
		t.Errorf("the pod still waiting: allowed=%t %+v, want injected", r.Allowed, r.Result)
	}
}

// blockingClient's EnsureTemplate waits for release, or for its context to end.
type blockingClient struct {
	once             sync.Once
	started, release chan struct{}
}

func (c *blockingClient) EnsureTemplate(ctx context.Context, _ *resourceapi.ResourceClaimTemplate) error {
	c.once.Do(func() { close(c.started) })
	select {
	case <-c.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestInterruptedValidationNotCached: a validation whose context ended may have missed what it
// looks for (the feasibility check answers "unknown" then); its verdict is not remembered.
func TestInterruptedValidationNotCached(t *testing.T) {
	validator := &slowValidator{}
	h, err := NewHandler(&fakeClient{}, WithValidator(validator))
	if err != nil {
		t.Fatal(err)
	}
	h.sharedTimeout = time.Millisecond
	pod := admissionRequest(t, admissionv1.Create, false, annotatedPod(t, "ns", 1, ""))
	if r := h.Handle(context.Background(), pod); !r.Allowed {
		t.Fatalf("denied: %+v", r.Result)
	}
	h.sharedTimeout = maxReviewTimeout
	validator.fast = true
	r := h.Handle(context.Background(), pod)
	if validator.calls != 2 || !r.Allowed || len(r.Warnings) != 1 {
		t.Errorf("%d validations, warnings %q: the interrupted one was remembered", validator.calls, r.Warnings)
	}
}

// slowValidator warns once it has had time to look: unless fast, it waits for its context to end
// and, interrupted, finds nothing, as the feasibility check does.
type slowValidator struct {
	mu    sync.Mutex
	fast  bool
	calls int
}

func (v *slowValidator) ValidateTemplate(ctx context.Context, _ *resourceapi.ResourceClaimTemplate) ([]string, error) {
	v.mu.Lock()
	v.calls++
	fast := v.fast
	v.mu.Unlock()
	if !fast {
		<-ctx.Done()
		return nil, nil
	}
	return []string{"nothing currently published can satisfy the claim"}, nil
}

// eventually polls cond until it holds, for at most 30 s.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRefusedTemplateIsDenied: a template client's refusal is the user's to fix, so the pod is
// denied with its message; any other failure stays an error to retry.
func TestRefusedTemplateIsDenied(t *testing.T) {
	for _, tc := range []struct {
		err      error
		wantCode int32
	}{
		{&RefusedError{Reason: "delete it"}, http.StatusForbidden},
		{fmt.Errorf("create: %w", apierrors.NewServiceUnavailable("busy")), http.StatusInternalServerError},
	} {
		for way, pod := range gpuPodsIn("ns") {
			h, err := NewHandler(&fakeClient{err: tc.err})
			if err != nil {
				t.Fatal(err)
			}
			resp := h.Handle(context.Background(), admissionRequest(t, admissionv1.Create, false, pod))
			if resp.Allowed || resp.Result.Code != tc.wantCode || !strings.Contains(resp.Result.Message, tc.err.Error()) {
				t.Errorf("%s: EnsureTemplate error %v: %+v, want code %d", way, tc.err, resp.Result, tc.wantCode)
			}
			var refused *RefusedError
			if errors.As(tc.err, &refused) && resp.Result.Message != refused.Reason {
				t.Errorf("%s: message %q, want the reason alone", way, resp.Result.Message)
			}
		}
	}
}
