package upgradecheck

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apiserverinternal "k8s.io/api/apiserverinternal/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/metadata"

	"github.com/gpu-dra/gpu-dra/internal/rewriterecord"
)

// rewriteEntry is a record's entry of a complete rewrite made on server.
func rewriteEntry(server string) string {
	return `{"server":"` + server + `","version":"v1","objects":7,"completed":"2026-12-01T00:00:00Z"}`
}

// pagedMetadata serves total objects of every resource in pages of at most the requested limit,
// recording the limits asked for (client-go's fake drops limit and continue).
type pagedMetadata struct {
	metadata.ResourceInterface // the methods the check never calls
	total                      int
	limits                     *[]int64
}

func (p pagedMetadata) Resource(schema.GroupVersionResource) metadata.Getter { return p }
func (p pagedMetadata) Namespace(string) metadata.ResourceInterface          { return p }

func (p pagedMetadata) List(_ context.Context, opts metav1.ListOptions) (*metav1.PartialObjectMetadataList, error) {
	*p.limits = append(*p.limits, opts.Limit)
	start := 0
	if opts.Continue != "" {
		if _, err := fmt.Sscanf(opts.Continue, "from-%d", &start); err != nil {
			return nil, err
		}
	}
	end := min(start+int(opts.Limit), p.total)
	l := &metav1.PartialObjectMetadataList{}
	for i := start; i < end; i++ {
		l.Items = append(l.Items, metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint(i)}})
	}
	if end < p.total {
		l.Continue = fmt.Sprintf("from-%d", end)
	}
	return l, nil
}

func svm(version, name, resource, condition string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "storagemigration.k8s.io/" + version, "kind": "StorageVersionMigration",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"resource": map[string]any{"group": "resource.k8s.io", "resource": resource, "version": "v1beta1"}},
	}}
	if condition != "" {
		u.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": condition, "status": "True", "reason": condition, "message": "", "lastTransitionTime": "2026-12-01T00:00:00Z"}}}
	}
	return u
}

// TestCheckStorage: object counts come in pages of 500; a resource with objects is safe once a
// StorageVersionMigration of any served version succeeded for it, not safe when the API is served
// and none did, unknown when it is not served; an encoding the target cannot read is not safe.
func TestCheckStorage(t *testing.T) {
	target := Release{1, 38}
	for _, tc := range []struct {
		name       string
		groups     []string
		migrations []runtime.Object
		encoding   string
		// rewrites are the record of kubectl dra migrate's rewrites (rewriterecord's data).
		rewrites map[string]string
		objects  int
		want     Status
		source   string
		reason   string
	}{
		{name: "no objects", objects: 0, want: Safe},
		{name: "no migration API", objects: 1234, want: Unknown, reason: "does not serve storagemigration.k8s.io"},
		{name: "v1alpha1 migrations succeeded", objects: 1234, groups: []string{"storagemigration.k8s.io/v1alpha1"}, want: Safe, source: "storagemigration.k8s.io/v1alpha1",
			migrations: []runtime.Object{svm("v1alpha1", "a", "deviceclasses", "Succeeded"), svm("v1alpha1", "b", "resourceclaims", "Succeeded"),
				svm("v1alpha1", "c", "resourceclaimtemplates", "Succeeded"), svm("v1alpha1", "d", "resourceslices", "Succeeded")}},
		{name: "v1 migration failed", objects: 3, groups: []string{"storagemigration.k8s.io/v1", "storagemigration.k8s.io/v1alpha1"}, want: NotSafe, source: "storagemigration.k8s.io/v1",
			migrations: []runtime.Object{svm("v1", "a", "deviceclasses", "Failed"), svm("v1alpha1", "b", "resourceclaims", "Succeeded")},
			reason:     "no StorageVersionMigration of storagemigration.k8s.io/v1 has succeeded"},
		{name: "rewritten on this release, no migration API", objects: 7, want: Safe, rewrites: map[string]string{
			"deviceclasses": rewriteEntry("v1.37.2"), "resourceclaims": rewriteEntry("v1.37.2"),
			"resourceclaimtemplates": rewriteEntry("v1.37.0"), "resourceslices": rewriteEntry("v1.37.2")}},
		{name: "rewrite recorded for some resources", objects: 7, want: Unknown, rewrites: map[string]string{"deviceclasses": rewriteEntry("v1.37.2")},
			reason: "does not serve storagemigration.k8s.io"},
		{name: "rewritten on an older release", objects: 7, want: Unknown, rewrites: map[string]string{
			"deviceclasses": rewriteEntry("v1.36.3"), "resourceclaims": rewriteEntry("v1.37.2"),
			"resourceclaimtemplates": rewriteEntry("v1.37.2"), "resourceslices": rewriteEntry("v1.37.2")},
			reason: "rewrote deviceclasses on v1.36.3, not on the release the cluster runs (v1.37.2)"},
		{name: "rewritten, migration API served and failed", objects: 7, groups: []string{"storagemigration.k8s.io/v1"}, want: Safe, source: "storagemigration.k8s.io/v1",
			migrations: []runtime.Object{svm("v1", "a", "deviceclasses", "Failed")}, rewrites: map[string]string{
				"deviceclasses": rewriteEntry("v1.37.2"), "resourceclaims": rewriteEntry("v1.37.2"),
				"resourceclaimtemplates": rewriteEntry("v1.37.2"), "resourceslices": rewriteEntry("v1.37.2")}},
		{name: "record unreadable", objects: 7, want: Unknown, rewrites: map[string]string{"deviceclasses": "{"},
			reason: "data.deviceclasses: unexpected end of JSON input"},
		{name: "written as v1beta1", objects: 0, groups: []string{"internal.apiserver.k8s.io/v1alpha1"}, encoding: "resource.k8s.io/v1beta1", want: NotSafe,
			source: "internal.apiserver.k8s.io/v1alpha1", reason: "writes deviceclasses as resource.k8s.io/v1beta1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var kubeObjs []runtime.Object
			if tc.encoding != "" {
				for _, res := range Resources {
					kubeObjs = append(kubeObjs, &apiserverinternal.StorageVersion{ObjectMeta: metav1.ObjectMeta{Name: "resource.k8s.io." + res},
						Status: apiserverinternal.StorageVersionStatus{CommonEncodingVersion: &tc.encoding}})
				}
			}
			if tc.rewrites != nil {
				kubeObjs = append(kubeObjs, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: rewriterecord.Namespace, Name: rewriterecord.Name}, Data: tc.rewrites})
			}
			kube := fake.NewClientset(kubeObjs...)
			disc := kube.Discovery().(*fakediscovery.FakeDiscovery)
			for _, gv := range append([]string{"resource.k8s.io/v1"}, tc.groups...) {
				disc.Resources = append(disc.Resources, &metav1.APIResourceList{GroupVersion: gv})
			}
			gvrs := map[schema.GroupVersionResource]string{}
			for _, v := range storageMigrationVersions {
				gvrs[schema.GroupVersionResource{Group: "storagemigration.k8s.io", Version: v, Resource: "storageversionmigrations"}] = "StorageVersionMigrationList"
			}
			var limits []int64
			c := Conn{Kube: kube, Metadata: pagedMetadata{total: tc.objects, limits: &limits},
				Dynamic: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), gvrs, tc.migrations...)}
			groups, err := kube.Discovery().ServerGroups()
			if err != nil {
				t.Fatal(err)
			}
			got := checkStorage(context.Background(), c, options{requestTimeout: defaultRequestTimeout}, "v1.37.2", []string{"v1"}, groupVersions(groups), target)
			if got.Status != tc.want || got.Source != tc.source || !strings.Contains(got.Reason, tc.reason) {
				t.Errorf("status %q source %q reason %q; want %q, %q, a reason containing %q", got.Status, got.Source, got.Reason, tc.want, tc.source, tc.reason)
			}
			for _, r := range got.Resources {
				if r.Objects != tc.objects {
					t.Errorf("%s: %d objects, want %d", r.Resource, r.Objects, tc.objects)
				}
			}
			// ceil(objects/500) pages per resource, or one empty page.
			pages := max(1, (tc.objects+pageSize-1)/pageSize)
			if len(limits) != pages*len(Resources) {
				t.Errorf("%d list calls, want %d", len(limits), pages*len(Resources))
			}
			for _, l := range limits {
				if l != pageSize {
					t.Fatalf("a list asked for %d objects, want pages of %d", l, pageSize)
				}
			}
		})
	}
}
