package app

import (
	"context"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	svmv1 "k8s.io/api/storagemigration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/manifest"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// TestPreflightAgainstAPIServer: preflight --to 1.38 through a kubeconfig against real API
// servers. A 1.34 server serving only v1beta1 is not safe; on 1.37 objects written through
// v1beta1 (the metric counts the requests, no StorageVersionMigration rewrote them) and a v1beta1
// manifest are not safe, objects written through v1 and recorded as migrated are safe, and a user
// who may not read /metrics gets "could not tell".
func TestPreflightAgainstAPIServer(t *testing.T) {
	ctx := context.Background()
	class := func(name string) *resourceapi.DeviceClass {
		return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	t.Run("1.34 serving v1beta1 only", func(t *testing.T) {
		srv := testapiserver.Start(t, release(t, "1.34.2"), testapiserver.WithRuntimeConfig(testapiserver.V1Beta1Only))
		if _, err := srv.Clientset.ResourceV1beta1().DeviceClasses().Create(ctx, &resourcev1beta1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "old"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		r := preflightRun(t, writeKubeconfig(t, srv.Config))
		expect(t, r, ExitNotSafe, "resource.k8s.io versions (cluster v1.34.2)   NOT SAFE", "gone in 1.38:    v1beta1", "deviceclasses                1  not known to be migrated")
	})

	srv := testapiserver.Start(t, release(t, "1.37.2"))
	kubeconfig := writeKubeconfig(t, srv.Config)
	t.Run("1.37 with v1 objects recorded as migrated", func(t *testing.T) {
		installChartWorkloads(t, srv)
		if _, err := srv.Clientset.ResourceV1().DeviceClasses().Create(ctx, class("new"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		r := preflightRun(t, kubeconfig)
		expect(t, r, ExitNotSafe, "Stored objects (storagemigration.k8s.io/v1)  NOT SAFE", "deviceclasses                1  not migrated", "fix: kubectl dra migrate")
		// What the storage version migrator records when it has rewritten every DeviceClass; no
		// controller manager runs here, so the test records it.
		svm, err := srv.Clientset.StoragemigrationV1().StorageVersionMigrations().Create(ctx, &svmv1.StorageVersionMigration{ObjectMeta: metav1.ObjectMeta{Name: "deviceclasses"},
			Spec: svmv1.StorageVersionMigrationSpec{Resource: metav1.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svm.Status.Conditions = []metav1.Condition{{Type: string(svmv1.MigrationSucceeded), Status: metav1.ConditionTrue, Reason: "Succeeded", Message: "migrated", LastTransitionTime: metav1.Now()}}
		if _, err := srv.Clientset.StoragemigrationV1().StorageVersionMigrations().UpdateStatus(ctx, svm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		r = preflightRun(t, kubeconfig)
		expect(t, r, 0, "Upgrade to Kubernetes 1.38: SAFE", "deviceclasses                1  migrated (deviceclasses)", "Clients requesting deprecated versions       SAFE",
			"gpu-dra installation                         SAFE",
			"DaemonSet gpu-dra/gpu-dra-kubelet-plugin: release gpu-dra, gpu-dra-0.1.0, version 0.1.0",
			"Deployment gpu-dra/gpu-dra-webhook: release gpu-dra, gpu-dra-0.1.0, version 0.1.0",
			"image ghcr.io/gpu-dra/gpu-dra:0.1.0")
		r = preflightRun(t, kubeconfig, "-f", "testdata/preflight/claim.v1.yaml")
		expect(t, r, 0, "Manifests (1 document)                       SAFE")
		r = preflightRun(t, kubeconfig, "-f", "testdata/preflight/old.v1beta1.yaml")
		expect(t, r, ExitNotSafe, "Manifests (3 documents)                      NOT SAFE", "fix: kubectl dra upgrade -f testdata/preflight/old.v1beta1.yaml --to v1 --in-place")
	})
	t.Run("1.37 without permission to read /metrics", func(t *testing.T) {
		viewer, err := srv.Env.AddUser(envtest.User{Name: "viewer"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Clientset.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "read-all"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"get", "list"}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Clientset.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "viewer-reads-all"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "read-all"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "viewer"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		r := preflightRun(t, writeKubeconfig(t, viewer.Config()))
		expect(t, r, ExitUnknown, "Clients requesting deprecated versions       COULD NOT TELL", "(403 Forbidden)")
	})
	t.Run("1.37 with objects written through v1beta1", func(t *testing.T) {
		if _, err := srv.Clientset.ResourceV1beta1().DeviceClasses().Create(ctx, &resourcev1beta1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "old"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		r := preflightRun(t, kubeconfig)
		expect(t, r, ExitNotSafe, "Clients requesting deprecated versions       NOT SAFE", "v1beta1 deviceclasses (removed in 1.38)")
	})
}

// installChartWorkloads creates the kubelet plugin's DaemonSet and the webhook's Deployment as the
// chart renders them (Helm SDK, default values), so preflight reads the chart's own labels.
func installChartWorkloads(t *testing.T, srv *testapiserver.Server) {
	t.Helper()
	ctx := context.Background()
	ch, err := loader.Load("../../../charts/gpu-dra")
	if err != nil {
		t.Fatal(err)
	}
	vals, err := util.ToRenderValuesWithSchemaValidation(ch, map[string]any{},
		common.ReleaseOptions{Name: "gpu-dra", Namespace: "gpu-dra", Revision: 1, IsInstall: true}, common.DefaultCapabilities, false)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gpu-dra"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	created := 0
	for _, d := range manifest.Documents([]byte(files["gpu-dra/templates/kubeletplugin-daemonset.yaml"] + "\n---\n" + files["gpu-dra/templates/webhook-deployment.yaml"])) {
		switch d.GVK.Kind {
		case "DaemonSet":
			var ds appsv1.DaemonSet
			if err := sigsyaml.Unmarshal(d.Raw, &ds); err != nil {
				t.Fatal(err)
			}
			_, err = srv.Clientset.AppsV1().DaemonSets("gpu-dra").Create(ctx, &ds, metav1.CreateOptions{})
		case "Deployment":
			var dep appsv1.Deployment
			if err := sigsyaml.Unmarshal(d.Raw, &dep); err != nil {
				t.Fatal(err)
			}
			_, err = srv.Clientset.AppsV1().Deployments("gpu-dra").Create(ctx, &dep, metav1.CreateOptions{})
		default:
			continue
		}
		if err != nil {
			t.Fatalf("create %s %s: %v", d.GVK.Kind, d.Name, err)
		}
		created++
	}
	if created != 2 {
		t.Fatalf("the chart rendered %d DaemonSets and Deployments, want 2", created)
	}
}

// release runs the binaries of one Kubernetes release. envtest prefers $KUBEBUILDER_ASSETS to the
// directory it is given, so the variable is pointed there for the test.
func release(t *testing.T, rel string) testapiserver.Option {
	dir := testapiserver.ReleaseAssetsDir(t, rel)
	t.Setenv(testapiserver.AssetsEnv, dir)
	return testapiserver.WithAssetsDir(dir)
}

func preflightRun(t *testing.T, kubeconfig string, args ...string) result {
	t.Helper()
	t.Setenv("KUBECONFIG", "")
	return run(t, "", append([]string{"preflight", "--to", "1.38", "--kubeconfig", kubeconfig}, args...)...)
}

func expect(t *testing.T, r result, code int, lines ...string) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit %d, want %d; stderr %q\n%s", r.code, code, r.stderr, r.stdout)
	}
	for _, l := range lines {
		if !strings.Contains(r.stdout, l) {
			t.Errorf("output lacks %q:\n%s", l, r.stdout)
		}
	}
}
