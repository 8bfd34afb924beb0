package charttest

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/certs"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// recorder is a stand-in for gpu-webhook that admits everything and records what the API
// server sent it, to check which requests the rendered configurations route to the webhook.
type recorder struct {
	mu   sync.Mutex
	seen []string // "<path> <kind> <namespace>/<name>"
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, "bad review", http.StatusBadRequest)
		return
	}
	name := review.Request.Name
	if name == "" {
		var obj struct {
			Metadata struct{ Name, GenerateName string } `json:"metadata"`
		}
		_ = json.Unmarshal(review.Request.Object.Raw, &obj)
		name = obj.Metadata.Name + obj.Metadata.GenerateName
	}
	rec.mu.Lock()
	rec.seen = append(rec.seen, fmt.Sprintf("%s %s %s/%s", r.URL.Path, review.Request.Kind.Kind, review.Request.Namespace, name))
	rec.mu.Unlock()
	review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
	review.Request = nil
	_ = json.NewEncoder(w).Encode(review)
}

func (rec *recorder) calls() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return slices.Clone(rec.seen)
}

// testWebhookRouting points the installed webhook configurations at a recorder and checks their
// rules, matchConditions and namespaceSelector on the real API server: only pods asking for GPUs
// (annotation or a class's extended resource) and claims/templates outside the excluded
// namespaces reach the webhook, admin-access ones also its mutating check, and the claims the
// scheduler or the resourceclaim controller generate none.
func testWebhookRouting(t *testing.T, srv *testapiserver.Server, resourceAPI string) {
	ctx := t.Context()
	cs := srv.Clientset
	bundle, _, err := certs.Renew(certs.Bundle{}, []string{"localhost"}, time.Now(), certs.Lifetimes{})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(bundle.Cert, bundle.Key)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	ts := httptest.NewUnstartedServer(rec)
	ts.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	for _, o := range certs.TLSOpts() {
		o(ts.TLS)
	}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	url := func(path string) *string {
		u := strings.Replace(ts.URL, "127.0.0.1", "localhost", 1) + path
		return &u
	}
	admission := cs.AdmissionregistrationV1()
	vwc, err := admission.ValidatingWebhookConfigurations().Get(ctx, "gpu-dra-webhook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range vwc.Webhooks {
		vwc.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: url(*vwc.Webhooks[i].ClientConfig.Service.Path + "/" + vwc.Webhooks[i].Name), CABundle: bundle.CACert}
	}
	if _, err := admission.ValidatingWebhookConfigurations().Update(ctx, vwc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	mwc, err := admission.MutatingWebhookConfigurations().Get(ctx, "gpu-dra-webhook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range mwc.Webhooks {
		mwc.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: url(*mwc.Webhooks[i].ClientConfig.Service.Path + "/" + mwc.Webhooks[i].Name), CABundle: bundle.CACert}
	}
	if _, err := admission.MutatingWebhookConfigurations().Update(ctx, mwc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	user, admins := "team-a", "admins"
	for _, n := range []string{user, "kube-system", admins} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}
		if n == admins {
			ns.Labels = map[string]string{"resource.kubernetes.io/admin-access": "true"}
		}
		if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, n := range []string{user, "kube-system", releaseNS, admins} {
		// No controller-manager here to create it; the ServiceAccount admission plugin wants it.
		if _, err := cs.CoreV1().ServiceAccounts(n).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	// podWith creates a pod whose one container has limits (and, with init, an init container
	// with them instead).
	podWith := func(ns, name string, annotations map[string]string, limits corev1.ResourceList, init bool) {
		t.Helper()
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations},
			Spec: corev1.PodSpec{
				AutomountServiceAccountToken: ptr.To(false),
				Containers:                   []corev1.Container{{Name: "c", Image: "busybox"}},
			},
		}
		if init {
			p.Spec.InitContainers = []corev1.Container{{Name: "i", Image: "busybox", Resources: corev1.ResourceRequirements{Limits: limits}}}
		} else {
			p.Spec.Containers[0].Resources.Limits = limits
		}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Errorf("create pod %s/%s: %v", ns, name, err)
		}
	}
	pod := func(ns, name string, annotations map[string]string) {
		t.Helper()
		podWith(ns, name, annotations, nil, false)
	}
	one := resource.MustParse("1")
	// The webhook configuration is read by the API server asynchronously: wait for the first call.
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pod(user, "probe-"+strconv.Itoa(len(rec.calls()))+"-"+strconv.FormatInt(time.Now().UnixNano(), 36), map[string]string{"gpu.example.com/count": "1"})
		return len(rec.calls()) > 0, nil
	})
	if err != nil {
		t.Fatalf("the API server never called the mutating webhook: %v", err)
	}
	before := len(rec.calls())
	pod(user, "annotated", map[string]string{"gpu.example.com/count": "2"})
	pod(user, "other-annotations", map[string]string{"example.com/owner": "me"})
	pod(user, "no-annotations", nil)
	pod("kube-system", "annotated-system", map[string]string{"gpu.example.com/count": "2"})
	pod(releaseNS, "annotated-release", map[string]string{"gpu.example.com/count": "2"})
	// Device-plugin style: a class's extended resource, its implicit name, in an init container.
	podWith(user, "limits", nil, corev1.ResourceList{"gpu.example.com/gpu": one}, false)
	podWith(user, "implicit-limits", nil, corev1.ResourceList{"deviceclass.resource.kubernetes.io/example-gpu.example.com": one}, false)
	podWith(user, "init-limits", nil, corev1.ResourceList{"example.com/gpu": one}, true)
	podWith(user, "other-limits", nil, corev1.ResourceList{"example.org/fpga": one}, false)

	gv, _ := schema.ParseGroupVersion(resourceAPI)
	// request is one request for class in the served version's shape (v1beta1 has no exactly).
	request := func(class string, selectors ...string) map[string]any {
		fields := map[string]any{"deviceClassName": class}
		if class == "admin" {
			fields = map[string]any{"deviceClassName": "gpu.example.com", "allocationMode": "All", "adminAccess": true}
		}
		if len(selectors) > 0 {
			var sel []any
			for _, s := range selectors {
				sel = append(sel, map[string]any{"cel": map[string]any{"expression": s}})
			}
			fields["selectors"] = sel
		}
		if gv.Version == "v1beta1" {
			fields["name"] = "gpu"
			return fields
		}
		return map[string]any{"name": "gpu", "exactly": fields}
	}
	// create makes a ResourceClaim or ResourceClaimTemplate with these devices, as cfg's user.
	create := func(cfg *rest.Config, kind, ns, name string, devices map[string]any, annotations ...string) error {
		t.Helper()
		spec := map[string]any{"devices": devices}
		resource := "resourceclaims"
		if kind == "ResourceClaimTemplate" {
			spec = map[string]any{"spec": spec}
			resource = "resourceclaimtemplates"
		}
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": resourceAPI, "kind": kind,
			"metadata": map[string]any{"name": name, "namespace": ns},
			"spec":     spec,
		}}
		for i := 0; i+1 < len(annotations); i += 2 {
			obj.SetAnnotations(map[string]string{annotations[i]: annotations[i+1]})
		}
		client := dynamic.NewForConfigOrDie(cfg).Resource(gv.WithResource(resource)).Namespace(ns)
		_, err := client.Create(ctx, obj, metav1.CreateOptions{})
		return err
	}
	mustCreate := func(cfg *rest.Config, kind, ns, name string, devices map[string]any, annotations ...string) {
		t.Helper()
		if err := create(cfg, kind, ns, name, devices, annotations...); err != nil {
			t.Errorf("create %s %s/%s: %v", kind, ns, name, err)
		}
	}
	requests := func(r ...any) map[string]any { return map[string]any{"requests": r} }
	const ours, other = "gpu.example.com", "e2e-test-driver"
	mustCreate(srv.Config, "ResourceClaimTemplate", user, "user-template", requests(request(ours)))
	mustCreate(srv.Config, "ResourceClaimTemplate", "kube-system", "system-template", requests(request(ours)))
	mustCreate(srv.Config, "ResourceClaim", user, "first-available", requests(map[string]any{
		"name": "gpu", "firstAvailable": []any{map[string]any{"name": "big", "deviceClassName": ours}},
	}))
	mustCreate(srv.Config, "ResourceClaim", user, "opaque-config", map[string]any{
		"requests": []any{request(other)},
		"config":   []any{map[string]any{"opaque": map[string]any{"driver": ours, "parameters": map[string]any{"kind": "GpuConfig"}}}},
	})
	mustCreate(srv.Config, "ResourceClaim", user, "selector", requests(request(other, `device.attributes["gpu.example.com"].model == "X"`)))
	mustCreate(srv.Config, "ResourceClaimTemplate", user, "other-driver", requests(request(other)))
	mustCreate(srv.Config, "ResourceClaim", user, "misspelled-class", requests(request("gpu.exmaple.com")))
	mustCreate(srv.Config, "ResourceClaim", user, "other-class-of-the-chart", requests(request("gpu-timesliced.example.com")))
	// The scheduler's claim for a pod's extended resources (KEP-5004), made in its binding step.
	mustCreate(srv.Config, "ResourceClaim", user, "pod-extended-resources-x", requests(request(ours)), "resource.kubernetes.io/extended-resource-claim", "true")
	// Admin access: the mutating entry sees the claim before the API server checks the
	// namespace's label, and refuses it.
	mustCreate(srv.Config, "ResourceClaimTemplate", admins, "admin-template", requests(request("admin")))
	if err := create(srv.Config, "ResourceClaim", user, "admin-unlabelled", requests(request("admin"))); err == nil || !strings.Contains(err.Error(), "admin-access") {
		t.Errorf("admin access in an unlabelled namespace: err = %v, want the API server's refusal", err)
	}
	// What the resourceclaim controller creates for a pod from a template (under either identity
	// kube-controller-manager may use) was judged as the template.
	for _, controller := range []string{"system:serviceaccount:kube-system:resource-claim-controller", "system:kube-controller-manager"} {
		cfg := rest.CopyConfig(srv.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: controller, Groups: []string{"system:masters"}}
		mustCreate(cfg, "ResourceClaim", user, "generated-"+strconv.Itoa(len(controller)), requests(request(ours)))
	}

	got := rec.calls()[before:]
	judged := "/validate-resource-claim/resourceclaims.gpu.example.com "
	classOnly := "/validate-resource-claim/missing-class.resourceclaims.gpu.example.com "
	adminCheck := "/check-admin-access/admin-access.resourceclaims.gpu.example.com "
	want := []string{
		"/mutate-pod/pods.gpu.example.com Pod " + user + "/annotated",
		"/mutate-pod/pods.gpu.example.com Pod " + user + "/limits",
		"/mutate-pod/pods.gpu.example.com Pod " + user + "/implicit-limits",
		"/mutate-pod/pods.gpu.example.com Pod " + user + "/init-limits",
		judged + "ResourceClaimTemplate " + user + "/user-template",
		judged + "ResourceClaim " + user + "/first-available",
		judged + "ResourceClaim " + user + "/opaque-config",
		judged + "ResourceClaim " + user + "/selector",
		classOnly + "ResourceClaimTemplate " + user + "/other-driver",
		classOnly + "ResourceClaim " + user + "/misspelled-class",
		judged + "ResourceClaim " + user + "/other-class-of-the-chart",
		adminCheck + "ResourceClaimTemplate " + admins + "/admin-template",
		judged + "ResourceClaimTemplate " + admins + "/admin-template",
		adminCheck + "ResourceClaim " + user + "/admin-unlabelled",
	}
	if !slices.Equal(got, want) {
		t.Errorf("webhook calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
