package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	svmv1 "k8s.io/api/storagemigration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"

	"github.com/gpu-dra/gpu-dra/internal/rewriterecord"
	"github.com/gpu-dra/gpu-dra/internal/upgradecheck"
)

// fakeCluster is what a cluster shows preflight: its version, the group versions it serves, how
// many objects of each resource.k8s.io resource it holds, which resources a StorageVersionMigration
// rewrote, its /metrics (a testdata file; "" answers 403) and the chart's workloads.
type fakeCluster struct {
	server   string
	served   []string
	objects  map[string]int
	migrated []string
	// rewritten are the resources kubectl dra migrate recorded as rewritten, each with the API
	// server's version at the time.
	rewritten map[string]string
	metrics   string
	workloads []runtime.Object
}

var preflightKinds = map[string]string{"deviceclasses": "DeviceClass", "resourceclaims": "ResourceClaim",
	"resourceclaimtemplates": "ResourceClaimTemplate", "resourceslices": "ResourceSlice"}

func (f fakeCluster) conn(t *testing.T) upgradecheck.Conn {
	t.Helper()
	var migrations []runtime.Object
	for _, res := range f.migrated {
		migrations = append(migrations, &svmv1.StorageVersionMigration{TypeMeta: metav1.TypeMeta{APIVersion: "storagemigration.k8s.io/v1", Kind: "StorageVersionMigration"},
			ObjectMeta: metav1.ObjectMeta{Name: "migrate-" + res},
			Spec:       svmv1.StorageVersionMigrationSpec{Resource: metav1.GroupResource{Group: "resource.k8s.io", Resource: res}},
			Status:     svmv1.StorageVersionMigrationStatus{Conditions: []metav1.Condition{{Type: string(svmv1.MigrationSucceeded), Status: metav1.ConditionTrue}}}})
	}
	svmScheme := runtime.NewScheme()
	if err := svmv1.AddToScheme(svmScheme); err != nil {
		t.Fatal(err)
	}
	dyn := dynamicfake.NewSimpleDynamicClient(svmScheme, migrations...)
	kubeObjs := f.workloads
	if f.rewritten != nil {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: rewriterecord.Namespace, Name: rewriterecord.Name}, Data: map[string]string{}}
		for res, server := range f.rewritten {
			cm.Data[res] = fmt.Sprintf(`{"server":%q,"version":"v1","objects":%d,"completed":"2026-12-04T15:00:00Z"}`, server, f.objects[res])
		}
		kubeObjs = append(slices.Clone(kubeObjs), cm)
	}
	kube := fake.NewClientset(kubeObjs...)
	disc := kube.Discovery().(*fakediscovery.FakeDiscovery)
	disc.FakedServerVersion = &version.Info{GitVersion: f.server}
	newest := ""
	for _, gv := range f.served {
		list := &metav1.APIResourceList{GroupVersion: gv}
		if g, v, _ := strings.Cut(gv, "/"); g == "resource.k8s.io" {
			if newest == "" {
				newest = v
			}
			for res, kind := range preflightKinds {
				list.APIResources = append(list.APIResources, metav1.APIResource{Name: res, Kind: kind, Verbs: metav1.Verbs{"list"}})
			}
		}
		disc.Resources = append(disc.Resources, list)
	}
	scheme := runtime.NewScheme()
	metav1.AddMetaToScheme(scheme)
	var metas []runtime.Object
	for res, n := range f.objects {
		for i := range n {
			m := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/" + newest, Kind: preflightKinds[res]},
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", res, i)}}
			if res == "resourceclaims" || res == "resourceclaimtemplates" {
				m.Namespace = "ml"
			}
			metas = append(metas, m)
		}
	}
	return upgradecheck.Conn{Kube: kube, Metadata: metadatafake.NewSimpleMetadataClient(scheme, metas...), Dynamic: dyn,
		Metrics: func(context.Context) (io.ReadCloser, error) {
			if f.metrics == "" {
				return nil, apierrors.NewForbidden(schema.GroupResource{}, "/metrics", fmt.Errorf("user \"viewer\" cannot get path \"/metrics\""))
			}
			data, err := os.ReadFile(filepath.Join("testdata", "preflight", f.metrics))
			return io.NopCloser(bytes.NewReader(data)), err
		}}
}

// chartWorkloads are a gpu-dra release's DaemonSet and Deployment, as the chart labels them.
func chartWorkloads(version string) []runtime.Object {
	labels := func(component string) map[string]string {
		l := map[string]string{"helm.sh/chart": "gpu-dra-" + version, "app.kubernetes.io/name": "gpu-dra",
			"app.kubernetes.io/instance": "gpu-dra", "app.kubernetes.io/component": component}
		if version != "" {
			l["app.kubernetes.io/version"] = version
		}
		return l
	}
	pod := corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "ghcr.io/gpu-dra/gpu-dra:" + version}}}
	return []runtime.Object{
		&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "gpu-dra", Name: "gpu-dra-kubelet-plugin", Labels: labels("kubelet-plugin")},
			Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: pod}}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "gpu-dra", Name: "gpu-dra-webhook", Labels: labels("webhook")},
			Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: pod}}},
		// Another chart's webhook: not the driver's.
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "webhook", Labels: map[string]string{
			"helm.sh/chart": "other-1.0.0", "app.kubernetes.io/component": "webhook"}}},
	}
}

var allResourceVersions = []string{"resource.k8s.io/v1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1"}

// TestPreflightGolden: preflight's text and JSON for the clusters an upgrade to 1.38 meets, with
// and without manifests; the exit status is 0 safe, 2 not safe, 3 could not tell.
func TestPreflightGolden(t *testing.T) {
	objects := map[string]int{"deviceclasses": 1, "resourceclaims": 3, "resourceclaimtemplates": 2, "resourceslices": 4}
	for _, tc := range []struct {
		name    string
		cluster *fakeCluster
		files   []string
		to      string
		code    int
	}{
		{name: "1.34-v1beta1-only", code: ExitNotSafe, cluster: &fakeCluster{server: "v1.34.2", served: []string{"resource.k8s.io/v1beta1"},
			objects: objects, metrics: "none.metrics", workloads: chartWorkloads("0.1.0")}},
		{name: "1.37-before-migration", code: ExitNotSafe, cluster: &fakeCluster{server: "v1.37.2",
			served:  append([]string{"storagemigration.k8s.io/v1"}, allResourceVersions...),
			objects: objects, metrics: "before-migration.metrics", workloads: chartWorkloads("0.1.0")}},
		{name: "1.37-migrated", code: 0, cluster: &fakeCluster{server: "v1.37.2",
			served:  append([]string{"storagemigration.k8s.io/v1"}, allResourceVersions...),
			objects: objects, migrated: []string{"deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"},
			metrics: "after-migration.metrics", workloads: chartWorkloads("0.1.0")}},
		{name: "1.37-rewritten-without-migration-api", code: 0, cluster: &fakeCluster{server: "v1.37.2", served: allResourceVersions,
			objects: objects, rewritten: map[string]string{"deviceclasses": "v1.37.2", "resourceclaims": "v1.37.2", "resourceclaimtemplates": "v1.37.2", "resourceslices": "v1.37.2"},
			metrics: "after-migration.metrics", workloads: chartWorkloads("0.1.0")}},
		{name: "1.37-rewritten-on-1.36", code: ExitUnknown, cluster: &fakeCluster{server: "v1.37.2", served: allResourceVersions,
			objects: objects, rewritten: map[string]string{"deviceclasses": "v1.36.3", "resourceclaims": "v1.37.2", "resourceclaimtemplates": "v1.37.2", "resourceslices": "v1.37.2"},
			metrics: "after-migration.metrics", workloads: chartWorkloads("0.1.0")}},
		{name: "1.37-migrated-to-1.39", to: "1.39", code: ExitNotSafe, cluster: &fakeCluster{server: "v1.37.2",
			served:  append([]string{"storagemigration.k8s.io/v1"}, allResourceVersions...),
			objects: objects, migrated: []string{"deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"},
			metrics: "after-migration.metrics", workloads: chartWorkloads("0.1.0")}},
		{name: "1.36-no-migration-api-no-metrics", code: ExitUnknown, cluster: &fakeCluster{server: "v1.36.3",
			served: []string{"resource.k8s.io/v1"}, objects: map[string]int{"resourceclaims": 1}, workloads: chartWorkloads("")}},
		{name: "1.37-empty", code: 0, cluster: &fakeCluster{server: "v1.37.2", served: []string{"resource.k8s.io/v1"}, metrics: "after-migration.metrics"}},
		{name: "1.36-default-target-1.37", to: "-", code: 0, cluster: &fakeCluster{server: "v1.36.3",
			served: []string{"resource.k8s.io/v1", "resource.k8s.io/v1beta1"}, metrics: "before-migration.metrics"}},
		{name: "1.37-with-manifests", code: ExitNotSafe, files: []string{"testdata/preflight/claim.v1.yaml", "testdata/preflight/old.v1beta1.yaml"},
			cluster: &fakeCluster{server: "v1.37.2", served: append([]string{"storagemigration.k8s.io/v1"}, allResourceVersions...),
				metrics: "after-migration.metrics", workloads: chartWorkloads("0.1.0")}},
		{name: "files-only-not-safe", code: ExitNotSafe, to: "1.38", files: []string{"testdata/preflight/claim.v1.yaml", "testdata/preflight/old.v1beta1.yaml", "testdata/preflight/class.v1beta2.yaml"}},
		{name: "files-only-safe", code: 0, to: "1.38", files: []string{"testdata/preflight/claim.v1.yaml", "testdata/preflight/class.v1beta2.yaml"}},
		{name: "files-only-1.39", code: ExitNotSafe, to: "1.39", files: []string{"testdata/preflight/class.v1beta2.yaml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, format := range []string{"text", "json"} {
				var out bytes.Buffer
				to := tc.to
				switch to {
				case "":
					to = "1.38"
				case "-": // the command's default: the release after the cluster's
					to = ""
				}
				o := &preflightOptions{streams: genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: io.Discard},
					flags: genericclioptions.NewConfigFlags(true), to: to, files: tc.files, output: format,
					connect: func() (upgradecheck.Conn, error) {
						if tc.cluster == nil {
							return upgradecheck.Conn{}, fmt.Errorf("no configuration has been provided")
						}
						return tc.cluster.conn(t), nil
					}}
				t.Setenv("KUBECONFIG", "")
				err := o.run(context.Background())
				if code := ExitCode(err); code != tc.code {
					t.Errorf("%s: exit %d (%v), want %d", format, code, err, tc.code)
				}
				ext := map[string]string{"text": ".txt", "json": ".json"}[format]
				golden(t, "testdata/preflight/golden/"+tc.name+ext, out.String())
			}
		})
	}
}
