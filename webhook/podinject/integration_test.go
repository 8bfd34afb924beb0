package podinject

import (
	"context"
	"errors"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/certs"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// TestIntegration runs the handler behind a real kube-apiserver, once serving resource.k8s.io/v1
// and once serving only v1beta1 like a 1.32 cluster. Needs KUBEBUILDER_ASSETS.
func TestIntegration(t *testing.T) {
	for _, tc := range []struct {
		name, runtimeConfig, wantVersion string
	}{
		{name: "v1", runtimeConfig: testapiserver.AllVersions, wantVersion: "v1"},
		{name: "v1beta1-only", runtimeConfig: testapiserver.V1Beta1Only, wantVersion: "v1beta1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEnv(t, tc.runtimeConfig)
			if got := e.srv.ServedResourceVersions(t); len(got) == 0 || got[0] != tc.wantVersion {
				t.Fatalf("server serves resource.k8s.io %v, want %s first", got, tc.wantVersion)
			}
			t.Run("pod gets the claim and the template", func(t *testing.T) { e.testPod(t, tc.wantVersion) })
			t.Run("one template per namespace and content", e.testSharing)
			t.Run("deployment template is not mutated, its pods are", e.testDeployment)
			t.Run("already injected pod is unchanged", e.testIdempotent)
			t.Run("dry-run creates nothing", e.testDryRun)
			t.Run("bad annotations are denied", e.testDenied)
			t.Run("existing templates", e.testEnsureExisting)
			t.Run("a template under a managed name with another spec is refused", func(t *testing.T) {
				checkCapturedTemplate(t, e.cs, e.namespace(t, "captured"))
			})
			t.Run("a deleted template comes back for the next pod", func(t *testing.T) {
				checkDeletedTemplateComesBack(t, e.cs, e.namespace(t, "deleted"))
			})
			t.Run("labelled templates not named as ours cost nothing", func(t *testing.T) {
				checkLabelledTemplatesCostNothing(t, e.cs, e.namespace(t, "labelled"))
			})
			t.Run("limits of a class's extended resource become a claim", e.testExtended)
			// Last: it stops the webhook server.
			t.Run("webhook down affects annotated pods only", e.testWebhookDown)
		})
	}
}

type env struct {
	srv        *testapiserver.Server
	cs         kubernetes.Interface
	templates  *draclient.Client
	stopServer func()
}

func startEnv(t *testing.T, runtimeConfig string) *env {
	return startEnvWith(t, nil, testapiserver.WithRuntimeConfig(runtimeConfig))
}

// startEnvWith starts a kube-apiserver with serverOpts that calls a handler made with the options
// handlerOpts returns for its clientset (beside the chart's default classes).
func startEnvWith(t *testing.T, handlerOpts func(kubernetes.Interface) []Option, serverOpts ...testapiserver.Option) *env {
	data, err := os.ReadFile("testdata/mutatingwebhookconfiguration.yaml")
	if err != nil {
		t.Fatal(err)
	}
	config := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := yaml.UnmarshalStrict(data, config); err != nil {
		t.Fatal(err)
	}
	// envtest writes the URL as https://host:port/<path> and adds the slash itself.
	for i := range config.Webhooks {
		if svc := config.Webhooks[i].ClientConfig.Service; svc != nil && svc.Path != nil {
			svc.Path = ptr.To(strings.TrimPrefix(*svc.Path, "/"))
		}
	}
	srv := testapiserver.Start(t, append(serverOpts, testapiserver.WithWebhooks(envtest.WebhookInstallOptions{
		MutatingWebhooks: []*admissionregistrationv1.MutatingWebhookConfiguration{config},
	}))...)
	opts := []Option{WithDeviceClasses(chartDefault...)}
	if handlerOpts != nil {
		opts = append(opts, handlerOpts(srv.Clientset)...)
	}
	h := clusterHandler(t, srv.Clientset, nil, opts...)
	wo := srv.Env.WebhookInstallOptions
	return &env{
		srv:        srv,
		cs:         srv.Clientset,
		templates:  draclient.New(srv.Clientset),
		stopServer: startWebhookServer(t, wo.LocalServingHost, wo.LocalServingPort, wo.LocalServingCertDir, h),
	}
}

var setLogger sync.Once

// setControllerRuntimeLogger sets the logger once per test binary, as cmd/gpu-webhook does: without
// one, controller-runtime keeps every per-request logger it hands out, and the heap grows with
// each review.
func setControllerRuntimeLogger(l logr.Logger) { setLogger.Do(func() { ctrllog.SetLogger(l) }) }

// startWebhookServer serves h at /mutate-pod the way cmd/gpu-webhook does, and returns a function
// that stops it (also run at cleanup).
func startWebhookServer(t testing.TB, host string, port int, certDir string, h http.Handler) func() {
	t.Helper()
	setControllerRuntimeLogger(klog.Background())
	server := webhook.NewServer(webhook.Options{Host: host, Port: port, CertDir: certDir, TLSOpts: certs.TLSOpts()})
	server.Register(Path, h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- server.Start(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for server.StartedChecker()(nil) != nil {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("webhook server on %s:%d did not start: %v", host, port, server.StartedChecker()(nil))
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("webhook server: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

func (e *env) namespace(t *testing.T, name string) string {
	t.Helper()
	_, err := e.cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return name
}

func gpuPod(name string, annotations map[string]string, containers ...string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Spec: corev1.PodSpec{
			RestartPolicy:  corev1.RestartPolicyNever,
			InitContainers: []corev1.Container{{Name: "setup", Image: "busybox"}},
		},
	}
	for _, c := range containers {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: c, Image: "busybox"})
	}
	return pod
}

func (e *env) createPod(t *testing.T, ns string, pod *corev1.Pod, opts metav1.CreateOptions) *corev1.Pod {
	t.Helper()
	out, err := e.cs.CoreV1().Pods(ns).Create(context.Background(), pod, opts)
	if err != nil {
		t.Fatalf("create pod %s/%s%s: %v", ns, pod.Name, pod.GenerateName, err)
	}
	return out
}

// checkWired asserts the pod references one template through the webhook's claim in exactly the
// wanted containers, and returns the template's name.
func checkWired(t *testing.T, pod *corev1.Pod, wantContainers ...string) string {
	t.Helper()
	var template string
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.Name == ClaimName && rc.ResourceClaimTemplateName != nil {
			template = *rc.ResourceClaimTemplateName
		}
	}
	if template == "" {
		t.Fatalf("pod %s: no %s claim in %+v", pod.Name, ClaimName, pod.Spec.ResourceClaims)
	}
	var got []string
	for _, c := range pod.Spec.Containers {
		if slices.ContainsFunc(c.Resources.Claims, func(r corev1.ResourceClaim) bool { return r.Name == ClaimName }) {
			got = append(got, c.Name)
		}
	}
	if !slices.Equal(got, wantContainers) {
		t.Errorf("pod %s: containers with the claim %v, want %v", pod.Name, got, wantContainers)
	}
	for _, c := range pod.Spec.InitContainers {
		if len(c.Resources.Claims) > 0 {
			t.Errorf("pod %s: init container %s got claims %v", pod.Name, c.Name, c.Resources.Claims)
		}
	}
	return template
}

func (e *env) managedTemplates(t *testing.T, ns string) []resourceapi.ResourceClaimTemplate {
	t.Helper()
	list, err := e.templates.ResourceClaimTemplates(ns).List(context.Background(), metav1.ListOptions{LabelSelector: ManagedByLabel + "=" + ManagedBy})
	if err != nil {
		t.Fatalf("list templates in %s: %v", ns, err)
	}
	return list.Items
}

func (e *env) testPod(t *testing.T, wantVersion string) {
	ctx := context.Background()
	ns := e.namespace(t, "pod")
	pod := e.createPod(t, ns, gpuPod("train", map[string]string{
		"gpu.example.com/count": "2",
		"gpu.example.com/model": "LATEST-GPU-MODEL",
	}, "app", "sidecar"), metav1.CreateOptions{})
	name := checkWired(t, pod, "app", "sidecar")

	// The template is stored in the newest served version: read it back in exactly that one.
	var req resourceapi.ExactDeviceRequest
	var labels map[string]string
	switch wantVersion {
	case "v1":
		tmpl, err := e.cs.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get v1 template: %v", err)
		}
		labels, req = tmpl.Labels, *tmpl.Spec.Spec.Devices.Requests[0].Exactly
	case "v1beta1":
		tmpl, err := e.cs.ResourceV1beta1().ResourceClaimTemplates(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get v1beta1 template: %v", err)
		}
		r := tmpl.Spec.Spec.Devices.Requests[0]
		labels = tmpl.Labels
		req = resourceapi.ExactDeviceRequest{DeviceClassName: r.DeviceClassName, AllocationMode: resourceapi.DeviceAllocationMode(r.AllocationMode), Count: r.Count}
		for _, s := range r.Selectors {
			req.Selectors = append(req.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s.CEL.Expression}})
		}
		if _, err := e.cs.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
			t.Errorf("v1 is served although the server should serve only v1beta1")
		}
	}
	if labels[ManagedByLabel] != ManagedBy || labels["gpu.example.com/count"] != "2" {
		t.Errorf("template labels %v", labels)
	}
	want := resourceapi.ExactDeviceRequest{
		DeviceClassName: "gpu.example.com",
		AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
		Count:           2,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.attributes["gpu.example.com"].model == "LATEST-GPU-MODEL"`,
		}}},
	}
	if req.DeviceClassName != want.DeviceClassName || req.AllocationMode != want.AllocationMode || req.Count != want.Count ||
		len(req.Selectors) != 1 || req.Selectors[0].CEL.Expression != want.Selectors[0].CEL.Expression {
		t.Errorf("stored request %+v, want %+v", req, want)
	}
}

func (e *env) testSharing(t *testing.T) {
	a, b := e.namespace(t, "share-a"), e.namespace(t, "share-b")
	two := map[string]string{"gpu.example.com/count": "2"}
	t1 := checkWired(t, e.createPod(t, a, gpuPod("one", two, "app"), metav1.CreateOptions{}), "app")
	t2 := checkWired(t, e.createPod(t, a, gpuPod("two", two, "app"), metav1.CreateOptions{}), "app")
	if t1 != t2 {
		t.Errorf("same request, different templates %s and %s", t1, t2)
	}
	t3 := checkWired(t, e.createPod(t, a, gpuPod("three", map[string]string{"gpu.example.com/count": "1"}, "app"), metav1.CreateOptions{}), "app")
	t4 := checkWired(t, e.createPod(t, b, gpuPod("one", two, "app"), metav1.CreateOptions{}), "app")
	if t3 == t1 || t4 != t1 {
		t.Errorf("templates %s, %s, %s: a different count needs its own, another namespace the same name", t1, t3, t4)
	}
	names := func(items []resourceapi.ResourceClaimTemplate) []string {
		var out []string
		for _, i := range items {
			out = append(out, i.Name)
		}
		slices.Sort(out)
		return out
	}
	wantA := []string{t1, t3}
	slices.Sort(wantA)
	if got := names(e.managedTemplates(t, a)); !slices.Equal(got, wantA) {
		t.Errorf("templates in %s: %v, want %v", a, got, wantA)
	}
	if got := names(e.managedTemplates(t, b)); !slices.Equal(got, []string{t1}) {
		t.Errorf("templates in %s: %v, want [%s]", b, got, t1)
	}
}

func (e *env) testDeployment(t *testing.T) {
	ctx := context.Background()
	ns := e.namespace(t, "deploy")
	labels := map[string]string{"app": "trainer"}
	tmpl := gpuPod("", map[string]string{"gpu.example.com/count": "4", "gpu.example.com/containers": "trainer"}, "trainer", "metrics")
	tmpl.Labels = labels
	tmpl.Spec.RestartPolicy = corev1.RestartPolicyAlways
	d, err := e.cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create deployment: %v", err)
	}
	if len(d.Spec.Template.Spec.ResourceClaims) != 0 || len(d.Spec.Template.Spec.Containers[0].Resources.Claims) != 0 {
		t.Errorf("the deployment's pod template was mutated: %+v", d.Spec.Template.Spec)
	}
	if len(e.managedTemplates(t, ns)) != 0 {
		t.Errorf("a deployment alone created templates")
	}
	// No controller-manager runs here: create the pod the ReplicaSet controller would.
	pod := &corev1.Pod{ObjectMeta: *d.Spec.Template.ObjectMeta.DeepCopy(), Spec: *d.Spec.Template.Spec.DeepCopy()}
	pod.GenerateName = "trainer-5d8c7b9f4-"
	name := checkWired(t, e.createPod(t, ns, pod, metav1.CreateOptions{}), "trainer")
	if got := e.managedTemplates(t, ns); len(got) != 1 || got[0].Name != name {
		t.Errorf("templates %v, want only %s", got, name)
	}
}

func (e *env) testIdempotent(t *testing.T) {
	ns := e.namespace(t, "again")
	first := e.createPod(t, ns, gpuPod("first", map[string]string{"gpu.example.com/count": "1"}, "app"), metav1.CreateOptions{})
	checkWired(t, first, "app")
	// A pod copied from an injected one (kubectl get -o yaml | kubectl create -f -).
	again := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "copy", Annotations: first.Annotations}, Spec: *first.Spec.DeepCopy()}
	again.Spec.NodeName = ""
	copied := e.createPod(t, ns, again, metav1.CreateOptions{})
	checkWired(t, copied, "app")
	if len(copied.Spec.ResourceClaims) != 1 || len(copied.Spec.Containers[0].Resources.Claims) != 1 {
		t.Errorf("injected twice: %+v", copied.Spec)
	}
}

func (e *env) testDryRun(t *testing.T) {
	ctx := context.Background()
	ns := e.namespace(t, "dry")
	pod := e.createPod(t, ns, gpuPod("try", map[string]string{"gpu.example.com/count": "3"}, "app"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	checkWired(t, pod, "app")
	if got := e.managedTemplates(t, ns); len(got) != 0 {
		t.Errorf("dry-run created templates %v", got)
	}
	if _, err := e.cs.CoreV1().Pods(ns).Get(ctx, "try", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("dry-run pod stored: %v", err)
	}
}

func (e *env) testDenied(t *testing.T) {
	ns := e.namespace(t, "denied")
	for _, tc := range []struct {
		annotations map[string]string
		want        string
	}{
		{map[string]string{"gpu.example.com/count": "abc"}, `metadata.annotations[gpu.example.com/count]: Invalid value: "abc": not a whole number of GPUs; use 1..8`},
		{map[string]string{"gpu.example.com/count": "0"}, `metadata.annotations[gpu.example.com/count]: Invalid value: "0": a pod asking for GPUs needs at least 1; use 1..8, or remove the annotation`},
		{map[string]string{"gpu.example.com/count": "-1"}, `metadata.annotations[gpu.example.com/count]: Invalid value: "-1": negative; use 1..8`},
		{map[string]string{"gpu.example.com/count": "10"}, `metadata.annotations[gpu.example.com/count]: Invalid value: "10": more than any node of driver gpu.example.com has (8); use 1..8`},
		{map[string]string{"gpu.example.com/count": "1", "gpu.example.com/memory": "lots"}, `metadata.annotations[gpu.example.com/memory]: Invalid value: "lots": not a quantity; use the least memory per GPU, e.g. 40Gi`},
		// 10 bytes that resource.ParseQuantity parses for a second: refused before it runs.
		{map[string]string{"gpu.example.com/count": "1", "gpu.example.com/memory": "1e-5000000"}, `metadata.annotations[gpu.example.com/memory]: Invalid value: "1e-5000000": exponent out of range (at most e100 or e-100); write a plain quantity of the least memory per GPU, e.g. 40Gi`},
		{map[string]string{"gpu.example.com/count": "1", "gpu.example.com/containers": "trainer"}, `metadata.annotations[gpu.example.com/containers]: Invalid value: "trainer": no container "trainer" in this pod; its containers are: app`},
	} {
		_, err := e.cs.CoreV1().Pods(ns).Create(context.Background(), gpuPod("bad", tc.annotations, "app"), metav1.CreateOptions{})
		want := `admission webhook "pods.gpu.example.com" denied the request: Pod "bad" is invalid: ` + tc.want
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("annotations %v: error %v, want it to contain %q", tc.annotations, err, want)
		}
	}
	if got := e.managedTemplates(t, ns); len(got) != 0 {
		t.Errorf("denied pods left templates %v", got)
	}
}

func (e *env) testWebhookDown(t *testing.T) {
	ns := e.namespace(t, "down")
	e.stopServer()
	e.createPod(t, ns, gpuPod("plain", nil, "app"), metav1.CreateOptions{})
	e.createPod(t, ns, gpuPod("other-annotations", map[string]string{"example.com/team": "a"}, "app"), metav1.CreateOptions{})
	_, err := e.cs.CoreV1().Pods(ns).Create(context.Background(), gpuPod("gpu", map[string]string{"gpu.example.com/count": "1"}, "app"), metav1.CreateOptions{})
	var status apierrors.APIStatus
	if err == nil || !errors.As(err, &status) || !strings.Contains(err.Error(), `failed calling webhook "pods.gpu.example.com"`) {
		t.Fatalf("annotated pod with the webhook down: %v, want an explicit webhook failure", err)
	}
}

// testEnsureExisting covers what the handler's cache hides: a second replica meeting a template the
// first one made (AlreadyExists through the DRA client's version fallback), someone else's
// template under a managed name, and a namespace that does not exist.
func (e *env) testEnsureExisting(t *testing.T) {
	checkEnsureTemplate(t, e.cs, e.namespace(t, "existing"))
	err := runAPIClient(t, NewAPIClient(e.cs)).EnsureTemplate(context.Background(), testTemplate(t, "no-such-namespace"))
	if err == nil || !strings.Contains(err.Error(), "create ResourceClaimTemplate no-such-namespace/") || !apierrors.IsNotFound(err) {
		t.Errorf("missing namespace: %v", err)
	}
}
