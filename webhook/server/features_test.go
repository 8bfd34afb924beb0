package server

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
	"github.com/gpu-dra/gpu-dra/webhook/claimadmission"
	"github.com/gpu-dra/gpu-dra/webhook/podinject"
)

// mutatingConfig sends every pod and every claim or template to the webhook's mutating handlers
// (the chart narrows both with matchConditions; charttest checks those).
func mutatingConfig() *admissionregistrationv1.MutatingWebhookConfiguration {
	entry := func(name, path string, rule admissionregistrationv1.Rule) admissionregistrationv1.MutatingWebhook {
		return admissionregistrationv1.MutatingWebhook{
			Name: name,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
				Namespace: "gpu-dra", Name: "gpu-dra-webhook", Path: ptr.To(strings.TrimPrefix(path, "/")),
			}},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: rule}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNoneOnDryRun),
			AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"gpu-dra"},
			}}},
		}
	}
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-dra-mutate"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{
			entry("pods.gpu.example.com", podinject.Path, admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}),
			entry("admin-access.resourceclaims.gpu.example.com", claimadmission.AdminAccessPath, admissionregistrationv1.Rule{
				APIGroups: []string{"resource.k8s.io"}, APIVersions: []string{"v1", "v1beta2", "v1beta1"}, Resources: []string{"resourceclaims", "resourceclaimtemplates"},
			}),
		},
	}
}

// TestServedFeaturesThroughAPIServer runs the webhook binary's wiring behind a real kube-apiserver
// with each release's flags and checks that what the cluster serves decides what happens: limits of
// the class's extended resource (untouched where served, a claim elsewhere), a model list
// (firstAvailable or the denial with the fix) and admin access outside a labelled namespace (the
// webhook's message first, or a warning where the field is dropped). It runs on the release in
// KUBEBUILDER_ASSETS.
func TestServedFeaturesThroughAPIServer(t *testing.T) {
	type want struct{ extended, list, adminDenied bool }
	cases := map[string][]struct {
		name, runtimeConfig, gates string
		// dropped: the class is stored without its extendedResourceName, as an API server that
		// did not serve the field (1.34, 1.35 by default) left it; the webhook restores it where
		// the field is served.
		dropped bool
		// kubelet, when set, is the kubeletVersion of a node in the cluster.
		kubelet string
		want    want
	}{
		"1.32": {{"seed flags", "resource.k8s.io/v1beta1=true", "DynamicResourceAllocation=true", false, "", want{}}},
		"1.34": {
			{"defaults", testapiserver.AllVersions, "", false, "", want{list: true, adminDenied: true}},
			{"class stored by an older release", testapiserver.AllVersions, "", true, "", want{list: true, adminDenied: true}},
			{"gates flipped", testapiserver.AllVersions, "DRAExtendedResource=true,DRAPrioritizedList=false,DRAAdminAccess=false", false, "", want{extended: true}},
		},
		"1.37": {
			{"defaults", "resource.k8s.io/v1=true", "", false, "", want{extended: true, list: true, adminDenied: true}},
			{"class stored by an older release", "resource.k8s.io/v1=true", "", true, "", want{extended: true, list: true, adminDenied: true}},
			{"kubelet of 1.37", "resource.k8s.io/v1=true", "", true, "v1.37.2", want{extended: true, list: true, adminDenied: true}},
			// The control plane is upgraded first: a 1.34 kubelet would run the pod without GPUs.
			{"kubelet of 1.34 under it", "resource.k8s.io/v1=true", "", true, "v1.34.2", want{list: true, adminDenied: true}},
		},
	}
	minor := testapiserver.Minor(t)
	if cases[minor] == nil {
		t.Skipf("SKIPPED: no expectations for kube-apiserver %s", minor)
	}
	for _, tc := range cases[minor] {
		t.Run(minor+" "+tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			srv := testapiserver.Start(t, testapiserver.WithRuntimeConfig(tc.runtimeConfig), testapiserver.WithFeatureGates(tc.gates),
				testapiserver.WithWebhooks(envtest.WebhookInstallOptions{MutatingWebhooks: []*admissionregistrationv1.MutatingWebhookConfiguration{mutatingConfig()}}))
			cs := srv.Clientset
			for _, ns := range []string{"gpu-dra", "team-a"} {
				if _, err := cs.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			// What the chart installs on 1.34+ (on 1.32 the field is unknown and dropped).
			class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.example.com"}, Spec: resourceapi.DeviceClassSpec{
				Selectors:            []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}},
				ExtendedResourceName: ptr.To("gpu.example.com/gpu"),
			}}
			if tc.dropped {
				class.Spec.ExtendedResourceName = nil
			}
			if _, err := draclient.New(cs).DeviceClasses().Create(ctx, class, metav1.CreateOptions{FieldValidation: metav1.FieldValidationIgnore}); err != nil {
				t.Fatal(err)
			}

			if tc.kubelet != "" {
				node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node"}, Status: v1.NodeStatus{NodeInfo: v1.NodeSystemInfo{KubeletVersion: tc.kubelet}}}
				if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			startWebhook(ctx, t, srv, func(o *Options) {
				o.Namespace = "gpu-dra"
				o.DeviceClasses = []podinject.DeviceClass{{Name: "gpu.example.com", ExtendedResourceName: "gpu.example.com/gpu"}}
			})

			t.Run("limits", func(t *testing.T) {
				if tc.dropped && tc.want.extended || tc.kubelet != "" {
					// The webhook restores the field once its informers have synced.
					if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
						dc, err := draclient.New(cs).DeviceClasses().Get(ctx, class.Name, metav1.GetOptions{})
						return err == nil && ptr.Deref(dc.Spec.ExtendedResourceName, "") == "gpu.example.com/gpu", nil
					}); err != nil {
						t.Fatalf("the webhook did not restore the class's extendedResourceName: %v", err)
					}
				}
				pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "limits"}, Spec: v1.PodSpec{Containers: []v1.Container{{
					Name: "app", Image: "busybox", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{"gpu.example.com/gpu": resource.MustParse("2")}},
				}}}}
				got, err := cs.CoreV1().Pods("team-a").Create(ctx, pod, metav1.CreateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				_, limited := got.Spec.Containers[0].Resources.Limits["gpu.example.com/gpu"]
				translated := len(got.Spec.ResourceClaims) == 1 && got.Spec.ResourceClaims[0].Name == podinject.ClaimName
				if limited == translated || translated == tc.want.extended {
					t.Errorf("limit kept %v, claim injected %v; want the cluster to serve it: %v", limited, translated, tc.want.extended)
				}
			})

			if tc.dropped && !tc.want.extended && tc.kubelet == "" {
				t.Run("nothing written where the field is dropped", func(t *testing.T) {
					// The restore runs once the informers have synced, within a second of the
					// start; a write would make the webhook a manager of the class, and helm's next
					// server-side apply of the class would conflict with it.
					time.Sleep(3 * time.Second)
					dc, err := draclient.New(cs).DeviceClasses().Get(ctx, class.Name, metav1.GetOptions{})
					if err != nil {
						t.Fatal(err)
					}
					for _, m := range dc.ManagedFields {
						if m.Manager == "gpu-dra-webhook" {
							t.Errorf("the webhook wrote the class where the API server drops extendedResourceName: %+v", m)
						}
					}
				})
			}

			t.Run("model list", func(t *testing.T) {
				pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "models", Annotations: map[string]string{
					"gpu.example.com/count": "1", "gpu.example.com/model": "A100,LATEST-GPU-MODEL",
				}}, Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app", Image: "busybox"}}}}
				_, err := cs.CoreV1().Pods("team-a").Create(ctx, pod, metav1.CreateOptions{})
				if tc.want.list {
					if err != nil {
						t.Fatalf("model list where firstAvailable is served: %v", err)
					}
					templates, err := draclient.New(cs).ResourceClaimTemplates("team-a").List(ctx, metav1.ListOptions{})
					if err != nil {
						t.Fatal(err)
					}
					found := false
					for _, tmpl := range templates.Items {
						if r := tmpl.Spec.Spec.Devices.Requests; len(r) == 1 && len(r[0].FirstAvailable) == 2 {
							found = true
						}
					}
					if !found {
						t.Errorf("no template with two subrequests stored: %+v", templates.Items)
					}
					return
				}
				if err == nil || !strings.Contains(err.Error(), "this cluster does not serve firstAvailable") {
					t.Errorf("model list where firstAvailable is dropped: %v, want the denial with the fix", err)
				}
			})

			t.Run("admin access", func(t *testing.T) {
				admin := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "admin"}, Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{
					Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
						DeviceClassName: "gpu.example.com", AllocationMode: resourceapi.DeviceAllocationModeAll, AdminAccess: ptr.To(true),
					}}}},
				}}}
				var warnings warningRecorder
				cfg := rest.CopyConfig(srv.Config)
				cfg.WarningHandler = &warnings
				_, err := draclient.New(kubernetesFor(t, cfg)).ResourceClaimTemplates("team-a").Create(ctx, admin, metav1.CreateOptions{})
				if tc.want.adminDenied {
					if err == nil || !strings.Contains(err.Error(), `admission webhook "admin-access.resourceclaims.gpu.example.com" denied the request`) ||
						!strings.Contains(err.Error(), "kubectl label namespace team-a resource.kubernetes.io/admin-access=true") {
						t.Errorf("admin access in an unlabelled namespace: %v, want the webhook's denial with the fix", err)
					}
					return
				}
				if err != nil || !strings.Contains(strings.Join(warnings.messages, "\n"), "this cluster drops adminAccess") {
					t.Errorf("admin access where the field is dropped: err %v, warnings %q", err, warnings.messages)
				}
			})
		})
	}
}

func kubernetesFor(t *testing.T, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

type warningRecorder struct{ messages []string }

func (w *warningRecorder) HandleWarningHeader(_ int, _ string, text string) {
	w.messages = append(w.messages, text)
}
