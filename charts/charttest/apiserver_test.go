package charttest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/chart/common"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/driver/faults"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// applier creates rendered objects on a real API server, as `helm install` would.
type applier struct {
	t      *testing.T
	cfg    *rest.Config
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newApplier(t *testing.T, cfg *rest.Config) *applier {
	t.Helper()
	a := &applier{t: t, cfg: cfg, dyn: dynamic.NewForConfigOrDie(cfg)}
	a.refresh()
	return a
}

func (a *applier) refresh() {
	a.t.Helper()
	cs := kubernetes.NewForConfigOrDie(a.cfg)
	groups, err := restmapper.GetAPIGroupResources(cs.Discovery())
	if err != nil {
		a.t.Fatalf("discovery: %v", err)
	}
	a.mapper = restmapper.NewDiscoveryRESTMapper(groups)
}

func (a *applier) resource(obj *unstructured.Unstructured) dynamic.ResourceInterface {
	a.t.Helper()
	gvk := obj.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		a.t.Fatalf("%s %s: the server does not serve it: %v", gvk, obj.GetName(), err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if obj.GetNamespace() == "" {
			obj.SetNamespace(releaseNS)
		}
		return a.dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
	}
	return a.dyn.Resource(m.Resource)
}

func (a *applier) create(ms []manifest) {
	a.t.Helper()
	for _, m := range ms {
		obj := &unstructured.Unstructured{Object: m.Obj}
		if _, err := a.resource(obj).Create(a.t.Context(), obj.DeepCopy(), metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			a.t.Errorf("create %s %s (%s): %v", m.kind(), m.name(), m.Source, err)
		}
	}
}

// TestInstallOnAPIServer creates everything the chart renders on a real kube-apiserver serving
// what a 1.32 cluster serves (v1beta1 only) and what a 1.34+ cluster serves (v1), with strict
// field validation: CEL in the DeviceClass, the admission policy and the webhook matchConditions
// is compiled by the server. Then it checks RBAC and the admission policy as the service
// accounts themselves.
func TestInstallOnAPIServer(t *testing.T) {
	for _, tc := range []struct {
		name          string
		runtimeConfig string
		c             cluster
	}{
		{"v1beta1-only-like-1.32", testapiserver.V1Beta1Only, clusters[0]},
		{"v1-like-1.34", testapiserver.AllVersions, clusters[1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testapiserver.Start(t, testapiserver.WithRuntimeConfig(tc.runtimeConfig))
			served := srv.ServedResourceVersions(t)
			caps := servedCapabilities(t, tc.c, served)
			// With several classes and the optional NetworkPolicy, so that the server validates them too.
			r := mustRender(t, caps, valuesYAML(t, deviceClassValues, append(slices.Clone(installSets), networkPolicySets...)...))
			if _, ok := r.find("NetworkPolicy", ""); !ok {
				t.Fatal("no NetworkPolicy rendered")
			}
			dc, _ := r.find("DeviceClass", "")
			if dc.apiVersion() != tc.c.wantResourceAPI {
				t.Fatalf("server serves %v; chart chose %s, want %s", served, dc.apiVersion(), tc.c.wantResourceAPI)
			}
			ctx := t.Context()
			if _, err := srv.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: releaseNS}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			a := newApplier(t, srv.Config)
			a.create(r.Manifests)
			if t.Failed() {
				t.FailNow()
			}
			t.Run("RBAC", func(t *testing.T) { testRBAC(t, srv) })
			t.Run("SliceAdmissionPolicy", func(t *testing.T) { testSlicePolicy(t, srv, dc.apiVersion()) })
			t.Run("WebhookConfigPolicy", func(t *testing.T) { testWebhookConfigPolicy(t, srv) })
			t.Run("WebhookRouting", func(t *testing.T) { testWebhookRouting(t, srv, dc.apiVersion()) })
			t.Run("CertManager", func(t *testing.T) { testCertManagerObjects(t, srv, a, caps) })
		})
	}
}

// servedCapabilities are c's capabilities with the resource.k8s.io versions a server serves.
func servedCapabilities(t *testing.T, c cluster, served []string) *common.Capabilities {
	t.Helper()
	caps := capabilities(t, c)
	caps.APIVersions = slices.DeleteFunc(caps.APIVersions, func(v string) bool { return strings.HasPrefix(v, "resource.k8s.io/") })
	for _, v := range served {
		caps.APIVersions = append(caps.APIVersions, "resource.k8s.io/"+v)
	}
	return caps
}

// serviceAccounts are the chart's identities and the file of what each may do.
var serviceAccounts = []string{"gpu-dra-kubelet-plugin", "gpu-dra-webhook", "gpu-dra-cleanup"}

func impersonate(cfg *rest.Config, sa string, extra map[string][]string) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + releaseNS + ":" + sa, Extra: extra}
	return c
}

// rules lists what the identity may do in namespace, one "verb group/resource[/name]" a line,
// as `kubectl auth can-i --list` does (SelfSubjectRulesReview), minus what every authenticated
// user may do.
func rules(t *testing.T, cfg *rest.Config, namespace string) []string {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(cfg)
	review, err := cs.AuthorizationV1().SelfSubjectRulesReviews().Create(t.Context(), &authorizationv1.SelfSubjectRulesReview{
		Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: namespace},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectRulesReview: %v", err)
	}
	if review.Status.Incomplete {
		t.Fatalf("rules review incomplete: %s", review.Status.EvaluationError)
	}
	var out []string
	for _, r := range review.Status.ResourceRules {
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{""}
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					for _, n := range names {
						line := v + " " + g + "/" + res
						if g == "" {
							line = v + " core/" + res
						}
						if n != "" {
							line += " " + n
						}
						out = append(out, line)
					}
				}
			}
		}
	}
	for _, r := range review.Status.NonResourceRules {
		for _, u := range r.NonResourceURLs {
			for _, v := range r.Verbs {
				out = append(out, v+" "+u)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func testRBAC(t *testing.T, srv *testapiserver.Server) {
	ctx := t.Context()
	// A service account without bindings: what everyone may do anyway.
	if _, err := srv.Clientset.CoreV1().ServiceAccounts(releaseNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "baseline"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := "some-user-namespace"
	if _, err := srv.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, sa := range serviceAccounts {
		t.Run(sa, func(t *testing.T) {
			var got strings.Builder
			for _, namespace := range []string{releaseNS, other} {
				baseline := rules(t, impersonate(srv.Config, "baseline", nil), namespace)
				fmt.Fprintf(&got, "# namespace %s\n", map[string]string{releaseNS: "<release>", other: "<other>"}[namespace])
				for _, line := range rules(t, impersonate(srv.Config, sa, nil), namespace) {
					if !slices.Contains(baseline, line) {
						got.WriteString(line + "\n")
					}
				}
			}
			path := filepath.Join("testdata", "rbac", sa+".txt")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got.String()), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(want) != got.String() {
				t.Errorf("%s may do other things than %s lists.\ngot:\n%s", sa, path, got.String())
			}
		})
	}

	t.Run("plugin's Node informer", func(t *testing.T) { testPluginNodeInformer(t, srv) })
	t.Run("plugin's faults source", func(t *testing.T) { testPluginFaultsSource(t, srv) })

	// Spot checks through SubjectAccessReview, as the authorizer answers the API server.
	for _, tc := range []struct {
		sa        string
		attrs     authorizationv1.ResourceAttributes
		wantAllow bool
	}{
		{"gpu-dra-kubelet-plugin", authorizationv1.ResourceAttributes{Verb: "create", Group: "resource.k8s.io", Resource: "resourceslices"}, true},
		{"gpu-dra-kubelet-plugin", authorizationv1.ResourceAttributes{Verb: "update", Group: "resource.k8s.io", Resource: "resourceclaims", Namespace: other}, false},
		// Claim device status: server-side apply of the status, and the 1.36+ per-driver check.
		{"gpu-dra-kubelet-plugin", authorizationv1.ResourceAttributes{Verb: "patch", Group: "resource.k8s.io", Resource: "resourceclaims", Subresource: "status", Namespace: other}, true},
		{"gpu-dra-kubelet-plugin", authorizationv1.ResourceAttributes{Verb: "update", Group: "resource.k8s.io", Resource: "resourceclaims", Subresource: "status", Namespace: other}, false},
		{"gpu-dra-kubelet-plugin", authorizationv1.ResourceAttributes{Verb: "associated-node:patch", Group: "resource.k8s.io", Resource: "resourceclaims", Subresource: "driver", Name: "gpu.example.com", Namespace: other}, true},
		{"gpu-dra-kubelet-plugin", authorizationv1.ResourceAttributes{Verb: "associated-node:patch", Group: "resource.k8s.io", Resource: "resourceclaims", Subresource: "driver", Name: "nic.example.com", Namespace: other}, false},
		{"gpu-dra-kubelet-plugin", authorizationv1.ResourceAttributes{Verb: "arbitrary-node:patch", Group: "resource.k8s.io", Resource: "resourceclaims", Subresource: "driver", Name: "gpu.example.com", Namespace: other}, false},
		{"gpu-dra-kubelet-plugin", authorizationv1.ResourceAttributes{Verb: "list", Resource: "secrets", Namespace: releaseNS}, false},
		{"gpu-dra-webhook", authorizationv1.ResourceAttributes{Verb: "create", Group: "resource.k8s.io", Resource: "resourceclaimtemplates", Namespace: other}, true},
		{"gpu-dra-webhook", authorizationv1.ResourceAttributes{Verb: "delete", Group: "resource.k8s.io", Resource: "resourceclaimtemplates", Namespace: other}, false},
		{"gpu-dra-webhook", authorizationv1.ResourceAttributes{Verb: "update", Resource: "secrets", Namespace: releaseNS, Name: "gpu-dra-webhook-tls"}, true},
		{"gpu-dra-webhook", authorizationv1.ResourceAttributes{Verb: "get", Resource: "secrets", Namespace: releaseNS, Name: "someone-elses"}, false},
		{"gpu-dra-webhook", authorizationv1.ResourceAttributes{Verb: "get", Resource: "secrets", Namespace: other, Name: "gpu-dra-webhook-tls"}, false},
		{"gpu-dra-webhook", authorizationv1.ResourceAttributes{Verb: "update", Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations", Name: "gpu-dra-webhook"}, true},
		{"gpu-dra-webhook", authorizationv1.ResourceAttributes{Verb: "update", Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations", Name: "another-webhook"}, false},
		{"gpu-dra-webhook", authorizationv1.ResourceAttributes{Verb: "create", Group: "resource.k8s.io", Resource: "resourceslices"}, false},
		// Claims' allocations for the "held now" warning: read, never written.
		{"gpu-dra-webhook", authorizationv1.ResourceAttributes{Verb: "watch", Group: "resource.k8s.io", Resource: "resourceclaims"}, true},
		{"gpu-dra-webhook", authorizationv1.ResourceAttributes{Verb: "update", Group: "resource.k8s.io", Resource: "resourceclaims", Namespace: other}, false},
		{"gpu-dra-cleanup", authorizationv1.ResourceAttributes{Verb: "deletecollection", Group: "resource.k8s.io", Resource: "resourceslices"}, true},
		{"gpu-dra-cleanup", authorizationv1.ResourceAttributes{Verb: "create", Group: "resource.k8s.io", Resource: "resourceslices"}, false},
		// The nodes' simulated faults: each plugin watches its node's ConfigMap, the uninstall hook
		// deletes them all; only in the release namespace, and no more.
		{"gpu-dra-kubelet-plugin", authorizationv1.ResourceAttributes{Verb: "watch", Resource: "configmaps", Namespace: releaseNS}, true},
		{"gpu-dra-kubelet-plugin", authorizationv1.ResourceAttributes{Verb: "get", Resource: "configmaps", Namespace: releaseNS, Name: "gpu-dra-inventory"}, false},
		{"gpu-dra-kubelet-plugin", authorizationv1.ResourceAttributes{Verb: "update", Resource: "configmaps", Namespace: releaseNS, Name: "gpu-dra-faults-node-a"}, false},
		{"gpu-dra-kubelet-plugin", authorizationv1.ResourceAttributes{Verb: "list", Resource: "configmaps", Namespace: other}, false},
		{"gpu-dra-kubelet-plugin", authorizationv1.ResourceAttributes{Verb: "create", Resource: "events", Namespace: other}, true},
		{"gpu-dra-kubelet-plugin", authorizationv1.ResourceAttributes{Verb: "create", Group: "events.k8s.io", Resource: "events", Namespace: other}, false},
		{"gpu-dra-cleanup", authorizationv1.ResourceAttributes{Verb: "deletecollection", Resource: "configmaps", Namespace: releaseNS}, true},
		{"gpu-dra-cleanup", authorizationv1.ResourceAttributes{Verb: "deletecollection", Resource: "configmaps", Namespace: other}, false},
		{"gpu-dra-cleanup", authorizationv1.ResourceAttributes{Verb: "list", Resource: "configmaps", Namespace: releaseNS}, false},
	} {
		sar, err := srv.Clientset.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:" + releaseNS + ":" + tc.sa,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + releaseNS, "system:authenticated"},
			ResourceAttributes: &tc.attrs,
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != tc.wantAllow {
			t.Errorf("%s %s %s/%s (subresource %q) %s in %q: allowed %v, want %v", tc.sa, tc.attrs.Verb, tc.attrs.Group, tc.attrs.Resource, tc.attrs.Subresource, tc.attrs.Name, tc.attrs.Namespace, sar.Status.Allowed, tc.wantAllow)
		}
	}
}

func slice(apiVersion, name, node string) *unstructured.Unstructured {
	return driverSlice(apiVersion, name, node, "gpu.example.com")
}

func driverSlice(apiVersion, name, node, driver string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": apiVersion,
		"kind":       "ResourceSlice",
		"metadata":   map[string]any{"name": name},
		"spec": map[string]any{
			"driver":   driver,
			"nodeName": node,
			"pool":     map[string]any{"name": node, "generation": int64(1), "resourceSliceCount": int64(1)},
		},
	}}
}

const nodeClaim = "authentication.kubernetes.io/node-name"

// testSlicePolicy acts as the plugin's service account with the node claim a pod-bound token
// carries, and as the admin.
func testSlicePolicy(t *testing.T, srv *testapiserver.Server, apiVersion string) {
	ctx := t.Context()
	gv, _ := schema.ParseGroupVersion(apiVersion)
	gvr := gv.WithResource("resourceslices")
	admin := dynamic.NewForConfigOrDie(srv.Config).Resource(gvr)
	onNodeA := dynamic.NewForConfigOrDie(impersonate(srv.Config, "gpu-dra-kubelet-plugin", map[string][]string{nodeClaim: {"node-a"}})).Resource(gvr)
	noClaim := dynamic.NewForConfigOrDie(impersonate(srv.Config, "gpu-dra-kubelet-plugin", nil)).Resource(gvr)

	// Policies take effect asynchronously once their type checking ran.
	var last error
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = onNodeA.Create(ctx, slice(apiVersion, "probe-node-b", "node-b"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last != nil, nil
	})
	if err != nil {
		t.Fatalf("the admission policy never denied a slice for another node: %v", err)
	}
	if !strings.Contains(last.Error(), "may only write ResourceSlices with spec.nodeName node-a") {
		t.Errorf("denial does not explain itself: %v", last)
	}

	if _, err := onNodeA.Create(ctx, slice(apiVersion, "node-a-gpu", "node-a"), metav1.CreateOptions{}); err != nil {
		t.Errorf("plugin on node-a creating its own slice: %v", err)
	}
	if _, err := noClaim.Create(ctx, slice(apiVersion, "no-claim", "node-a"), metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "node-name claim") {
		t.Errorf("plugin without a node claim: err = %v, want a denial naming the claim", err)
	}
	if _, err := admin.Create(ctx, slice(apiVersion, "node-b-gpu", "node-b"), metav1.CreateOptions{}); err != nil {
		t.Errorf("other users are not restricted by the policy: %v", err)
	}
	if err := onNodeA.Delete(ctx, "node-b-gpu", metav1.DeleteOptions{}); err == nil || !strings.Contains(err.Error(), "not \"node-b\"") {
		t.Errorf("plugin on node-a deleting node-b's slice: err = %v, want denied", err)
	}
	if err := onNodeA.Delete(ctx, "node-a-gpu", metav1.DeleteOptions{}); err != nil {
		t.Errorf("plugin on node-a deleting its own slice: %v", err)
	}

	// Another driver's slices on the plugin's own node: neither forged nor deleted.
	const other = "other.example.com"
	if _, err := onNodeA.Create(ctx, driverSlice(apiVersion, "node-a-forged", "node-a", other), metav1.CreateOptions{}); err == nil ||
		!strings.Contains(err.Error(), `the kubelet plugin of driver gpu.example.com may only write ResourceSlices with spec.driver gpu.example.com, not "other.example.com"`) {
		t.Errorf("plugin on node-a creating a slice of %s: err = %v, want denied naming the driver", other, err)
	}
	if _, err := admin.Create(ctx, driverSlice(apiVersion, "node-a-other", "node-a", other), metav1.CreateOptions{}); err != nil {
		t.Fatalf("admin creating a slice of %s: %v", other, err)
	}
	otherSlice, err := onNodeA.Get(ctx, "node-a-other", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	otherSlice.SetLabels(map[string]string{"taken-over-by": "gpu-dra"})
	if _, err := onNodeA.Update(ctx, otherSlice, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), `not "other.example.com"`) {
		t.Errorf("plugin on node-a updating a slice of %s: err = %v, want denied", other, err)
	}
	if err := onNodeA.Delete(ctx, "node-a-other", metav1.DeleteOptions{}); err == nil || !strings.Contains(err.Error(), `not "other.example.com"`) {
		t.Errorf("plugin on node-a deleting a slice of %s: err = %v, want denied", other, err)
	}
	if err := onNodeA.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: "spec.nodeName=node-a"}); err == nil {
		t.Errorf("plugin on node-a deleting every slice of its node: admitted, want the %s slice refused", other)
	}
	if _, err := admin.Get(ctx, "node-a-other", metav1.GetOptions{}); err != nil {
		t.Errorf("the slice of %s on node-a is gone: %v", other, err)
	}
	if err := admin.Delete(ctx, "node-a-other", metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
	// The cleanup hook deletes every slice of the driver, whatever its node.
	cleanup := dynamic.NewForConfigOrDie(impersonate(srv.Config, "gpu-dra-cleanup", nil)).Resource(gvr)
	if err := cleanup.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: "spec.driver=gpu.example.com"}); err != nil {
		t.Errorf("cleanup hook deleting all slices: %v", err)
	}
	if l, err := admin.List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
		t.Errorf("after cleanup: %d slices left (%v)", len(l.Items), err)
	}
}

// certManagerCRDs returns the CRD manifests shipped in the cert-manager module.
func certManagerCRDs(t *testing.T) []manifest {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-json", "github.com/cert-manager/cert-manager").Output()
	if err != nil {
		t.Fatalf("locate cert-manager module: %v", err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("locate cert-manager module: %v %s", err, out)
	}
	var ms []manifest
	for _, f := range []string{"cert-manager.io_issuers.yaml", "cert-manager.io_certificates.yaml"} {
		data, err := os.ReadFile(filepath.Join(mod.Dir, "deploy", "crds", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range splitDocs(string(data)) {
			var obj map[string]any
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatal(err)
			}
			ms = append(ms, manifest{Source: f, Obj: obj})
		}
	}
	return ms
}

// testCertManagerObjects installs cert-manager's CRDs and creates the cert-manager mode's objects,
// validated by cert-manager's own schemas.
func testCertManagerObjects(t *testing.T, srv *testapiserver.Server, a *applier, caps any) {
	a.create(certManagerCRDs(t))
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		a.refresh()
		_, err := a.mapper.RESTMapping(schema.GroupKind{Group: "cert-manager.io", Kind: "Certificate"}, "v1")
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("cert-manager CRDs not served: %v", err)
	}
	r := mustRender(t, capabilities(t, clusters[1], "cert-manager.io/v1"), values(t, "certs.mode=cert-manager"))
	var cm []manifest
	for _, m := range r.Manifests {
		if strings.HasPrefix(m.apiVersion(), "cert-manager.io/") {
			cm = append(cm, m)
		}
	}
	if len(cm) != 4 {
		t.Fatalf("cert-manager mode renders %d cert-manager objects, want 4", len(cm))
	}
	a.create(cm)
}

// testPluginNodeInformer runs, as the plugin's service account, the informer the plugin watches
// its Node with (driver/plugin.NodeGroupWatcher: list and watch with a metadata.name field
// selector): it must sync and see a relabel, or node-group changes never reach the plugin.
func testPluginNodeInformer(t *testing.T, srv *testapiserver.Server) {
	ctx := t.Context()
	node, err := srv.Clientset.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-informer"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	asPlugin := kubernetes.NewForConfigOrDie(impersonate(srv.Config, "gpu-dra-kubelet-plugin", map[string][]string{nodeClaim: {node.Name}}))
	informer := coreinformers.NewFilteredNodeInformer(asPlugin, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.FieldSelector = "metadata.name=" + node.Name
	})
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	go informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		t.Fatal("the plugin's Node informer never synced: its service account may not list and watch its Node")
	}
	node.Labels = map[string]string{"gpu.example.com/group": "small"}
	if _, err := srv.Clientset.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
		o, ok, _ := informer.GetStore().GetByKey(node.Name)
		return ok && o.(*corev1.Node).Labels["gpu.example.com/group"] == "small", nil
	}); err != nil {
		t.Errorf("the plugin's Node informer did not see the relabel: %v", err)
	}
}

// testPluginFaultsSource runs the plugin's faults source with the plugin's service account: the
// Role lets it list and watch its node's ConfigMap, a fault written there reaches it, and it may not
// get or write ConfigMaps. Then the uninstall hook's service account deletes every node's faults
// ConfigMap, and nothing else.
func testPluginFaultsSource(t *testing.T, srv *testapiserver.Server) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	asPlugin := kubernetes.NewForConfigOrDie(impersonate(srv.Config, "gpu-dra-kubelet-plugin", nil))
	src := &faults.ConfigMapSource{Client: asPlugin, Namespace: releaseNS, Name: "gpu-dra-faults", NodeName: "node-faults"}
	reports := make(chan faults.Faults, 10)
	go func() { _ = src.Run(ctx, func(f faults.Faults) { reports <- f }) }()
	cms := srv.Clientset.CoreV1().ConfigMaps(releaseNS)
	anchor, err := cms.Get(ctx, "gpu-dra-faults", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart's faults ConfigMap: %v", err)
	}
	value := "gpu-1: {kind: xid, time: \"2026-12-03T10:00:00Z\", message: XID 79}\n"
	for _, node := range []string{"node-faults", "node-other"} {
		if _, err := cms.Create(ctx, faults.NewObject(releaseNS, "gpu-dra-faults", node, value, anchor), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case f := <-reports:
		if f["gpu-1"].Kind != faults.KindXID || f["gpu-1"].Message != "XID 79" {
			t.Errorf("report %v, want gpu-1 xid", f)
		}
	case <-ctx.Done():
		t.Fatal("the plugin's faults source never saw its node's ConfigMap: its service account may not list and watch it")
	}
	if _, err := asPlugin.CoreV1().ConfigMaps(releaseNS).Get(ctx, "gpu-dra-inventory", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the plugin gets another ConfigMap of the release namespace: %v", err)
	}
	if err := asPlugin.CoreV1().ConfigMaps(releaseNS).Delete(ctx, "gpu-dra-faults-node-other", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the plugin deletes another node's faults: %v", err)
	}

	asCleanup := kubernetes.NewForConfigOrDie(impersonate(srv.Config, "gpu-dra-cleanup", nil))
	if err := faults.DeleteAll(ctx, asCleanup, releaseNS, "gpu-dra-faults"); err != nil {
		t.Fatalf("the uninstall hook: %v", err)
	}
	left, err := cms.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, cm := range left.Items {
		names = append(names, cm.Name)
	}
	for _, want := range []string{"gpu-dra-faults", "gpu-dra-inventory"} {
		if !slices.Contains(names, want) {
			t.Errorf("the uninstall hook deleted %s", want)
		}
	}
	for _, gone := range []string{"gpu-dra-faults-node-faults", "gpu-dra-faults-node-other"} {
		if slices.Contains(names, gone) {
			t.Errorf("the uninstall hook left %s", gone)
		}
	}
	select {
	case f := <-reports:
		if len(f) != 0 {
			t.Errorf("report %v after the uninstall hook, want no faults", f)
		}
	case <-ctx.Done():
		t.Error("the plugin's faults source did not see its ConfigMap go")
	}
}
