package manifest

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

var resources = map[string]string{resourceversion.KindClaim: "resourceclaims", resourceversion.KindTemplate: "resourceclaimtemplates", resourceversion.KindDeviceClass: "deviceclasses"}

// TestAgainstAPIServer is the differential test: every claim, template and class of the corpus is
// created through the API server as v1beta1 and as v1beta2, read back as v1, and compared with
// what the tool writes for v1. The server defaults what it stores (allocationMode ExactCount,
// count 1, toleration operator Equal) and the tool deliberately does not (it keeps the manifest
// as the user wrote it), so the tool's output is compared after applying those same defaults;
// server-set metadata (uid, resourceVersion, timestamps, managedFields, generation) is ignored.
func TestAgainstAPIServer(t *testing.T) {
	srv := testapiserver.Start(t)
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	if v := srv.ServedResourceVersions(t); len(v) < 3 {
		t.Fatalf("the server serves resource.k8s.io %v; the test needs v1, v1beta2 and v1beta1", v)
	}
	inputs := []string{filepath.Join(seedDir, "resourceclaimtemplate.v1beta1.yaml"), filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml")}
	for _, tc := range goldenCases {
		inputs = append(inputs, filepath.Join("testdata/convert", tc.file))
	}
	namespaces := map[string]bool{}
	compared := 0
	for _, path := range inputs {
		in := read(t, path)
		want, _, err := Rewrite(in, "v1")
		if err != nil {
			t.Fatal(err)
		}
		wantDocs := Documents(want)
		for _, from := range []string{"v1beta1", "v1beta2"} {
			sent, _, err := Rewrite(in, from)
			if err != nil {
				t.Fatal(err)
			}
			for i, d := range Documents(sent) {
				if d.GVK.Group != resourceversion.Group || resources[d.GVK.Kind] == "" {
					continue
				}
				name := fmt.Sprintf("%s/document %d as %s", filepath.Base(path), d.Index, from)
				t.Run(name, func(t *testing.T) {
					ns := d.Namespace
					if ns == "" && d.GVK.Kind != resourceversion.KindDeviceClass {
						ns = "default"
					}
					if ns != "" && ns != "default" && !namespaces[ns] {
						createNamespace(t, ctx, srv, ns)
						namespaces[ns] = true
					}
					u := &unstructured.Unstructured{}
					if err := sigsyaml.Unmarshal(d.Raw, &u.Object); err != nil {
						t.Fatal(err)
					}
					gvr := schema.GroupVersionResource{Group: resourceversion.Group, Version: from, Resource: resources[d.GVK.Kind]}
					client := resourceClient(dyn, gvr, ns)
					if _, err := client.Create(ctx, u, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
						t.Fatalf("create %s as %s: %v\n%s", d.Name, from, err, d.Raw)
					}
					t.Cleanup(func() { _ = client.Delete(ctx, d.Name, metav1.DeleteOptions{}) })
					v1gvr := gvr
					v1gvr.Version = "v1"
					got, err := resourceClient(dyn, v1gvr, ns).Get(ctx, d.Name, metav1.GetOptions{})
					if err != nil {
						t.Fatal(err)
					}
					compareWithServer(t, d.GVK.Kind, got, wantDocs[i].Raw)
				})
				compared++
			}
		}
	}
	if compared < 2*len(inputs) {
		t.Errorf("only %d objects compared", compared)
	}
}

func resourceClient(dyn dynamic.Interface, gvr schema.GroupVersionResource, ns string) dynamic.ResourceInterface {
	if ns == "" {
		return dyn.Resource(gvr)
	}
	return dyn.Resource(gvr).Namespace(ns)
}

func createNamespace(t *testing.T, ctx context.Context, srv *testapiserver.Server, name string) {
	t.Helper()
	// Admin access is only granted in namespaces labelled for it.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"resource.kubernetes.io/admin-access": "true"}}}
	if _, err := srv.Clientset.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// compareWithServer decodes what the server returned as v1 and what the tool wrote for v1,
// applies the server's defaults to the latter and compares what the user controls.
func compareWithServer(t *testing.T, kind string, server *unstructured.Unstructured, tool []byte) {
	t.Helper()
	serverJSON, err := json.Marshal(server.Object)
	if err != nil {
		t.Fatal(err)
	}
	toolJSON, err := sigsyaml.YAMLToJSON(tool)
	if err != nil {
		t.Fatal(err)
	}
	if kind == resourceversion.KindDeviceClass {
		var s, o resourceapi.DeviceClass
		if err := json.Unmarshal(serverJSON, &s); err != nil {
			t.Fatal(err)
		}
		if err := sigsyaml.UnmarshalStrict(tool, &o); err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(s.Spec, o.Spec) || !sameUserMeta(s.ObjectMeta, o.ObjectMeta) {
			t.Errorf("server returned\n%s\ntool wrote\n%s", serverJSON, tool)
		}
		return
	}
	s, err := resourceversion.Decode(serverJSON, schema.GroupVersionKind{})
	if err != nil {
		t.Fatal(err)
	}
	// resourceversion.Decode applies the API server's request defaults (ExactCount, count 1).
	o, err := resourceversion.Decode(toolJSON, schema.GroupVersionKind{})
	if err != nil {
		t.Fatal(err)
	}
	defaultTolerations(o.Spec())
	if o.Arrived.Version != "v1" {
		t.Fatalf("tool output is %s, want v1", o.Arrived)
	}
	same := equality.Semantic.DeepEqual(s.Spec(), o.Spec())
	if s.Template != nil {
		same = same && sameUserMeta(s.Template.ObjectMeta, o.Template.ObjectMeta) && equality.Semantic.DeepEqual(s.Template.Spec.ObjectMeta, o.Template.Spec.ObjectMeta)
	} else {
		same = same && sameUserMeta(s.Claim.ObjectMeta, o.Claim.ObjectMeta)
	}
	if !same {
		t.Errorf("server returned\n%s\ntool wrote (before defaults)\n%s", s.V1Form(), tool)
	}
}

// defaultTolerations: the API server's default for DeviceToleration.operator.
func defaultTolerations(spec *resourceapi.ResourceClaimSpec) {
	for i := range spec.Devices.Requests {
		r := &spec.Devices.Requests[i]
		if r.Exactly != nil {
			for j := range r.Exactly.Tolerations {
				if r.Exactly.Tolerations[j].Operator == "" {
					r.Exactly.Tolerations[j].Operator = resourceapi.DeviceTolerationOpEqual
				}
			}
		}
		for k := range r.FirstAvailable {
			for j := range r.FirstAvailable[k].Tolerations {
				if r.FirstAvailable[k].Tolerations[j].Operator == "" {
					r.FirstAvailable[k].Tolerations[j].Operator = resourceapi.DeviceTolerationOpEqual
				}
			}
		}
	}
}

// sameUserMeta compares the metadata a manifest sets.
func sameUserMeta(a, b metav1.ObjectMeta) bool {
	return a.Name == b.Name && (a.Namespace == b.Namespace || b.Namespace == "") &&
		equality.Semantic.DeepEqual(a.Labels, b.Labels) && equality.Semantic.DeepEqual(emptyNil(a.Annotations), emptyNil(b.Annotations))
}

func emptyNil(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}
