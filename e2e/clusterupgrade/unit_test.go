package clusterupgrade

import (
	"bytes"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
)

// TestStoredVersion decodes values as the API server writes them to etcd: its protobuf
// serializer (built-in types) and JSON (what a CRD would be).
func TestStoredVersion(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{resourcev1.AddToScheme, resourcev1beta1.AddToScheme, resourcev1beta2.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	pb := protobuf.NewSerializer(scheme, scheme)
	js := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme, json.SerializerOptions{})
	meta := metav1.ObjectMeta{Name: "gpu.example.com"}
	for _, tc := range []struct {
		name string
		obj  runtime.Object
		gv   schema.GroupVersion
		enc  runtime.Encoder
		want string
	}{
		{"v1beta1 protobuf", &resourcev1beta1.DeviceClass{ObjectMeta: meta}, resourcev1beta1.SchemeGroupVersion, pb, "resource.k8s.io/v1beta1"},
		{"v1beta2 protobuf", &resourcev1beta2.DeviceClass{ObjectMeta: meta}, resourcev1beta2.SchemeGroupVersion, pb, "resource.k8s.io/v1beta2"},
		{"v1 protobuf", &resourcev1.DeviceClass{ObjectMeta: meta}, resourcev1.SchemeGroupVersion, pb, "resource.k8s.io/v1"},
		{"v1beta1 JSON", &resourcev1beta1.DeviceClass{ObjectMeta: meta}, resourcev1beta1.SchemeGroupVersion, js, "resource.k8s.io/v1beta1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.obj.GetObjectKind().SetGroupVersionKind(tc.gv.WithKind("DeviceClass"))
			var buf bytes.Buffer
			if err := tc.enc.Encode(tc.obj, &buf); err != nil {
				t.Fatal(err)
			}
			got, err := storedVersion(buf.Bytes())
			if err != nil || got != tc.want {
				t.Errorf("storedVersion = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	for _, bad := range [][]byte{nil, []byte("k8s\x00\xff\xff"), []byte(`{"kind":"DeviceClass"}`), []byte("garbage")} {
		if got, err := storedVersion(bad); err == nil {
			t.Errorf("storedVersion(%q) = %q, want an error", bad, got)
		}
	}
}

// TestStaleVersions: what the scenario counts as not yet migrated.
func TestStaleVersions(t *testing.T) {
	stored := map[string]string{
		"/registry/deviceclasses/gpu.example.com":         "resource.k8s.io/v1beta2",
		"/registry/resourceclaims/ns/a":                   "resource.k8s.io/v1",
		"/registry/resourceclaimtemplates/ns/example":     "resource.k8s.io/v1beta1",
		"/registry/devicetaintrules/rule":                 "resource.k8s.io/v1beta2",
		"/registry/resourceslices/node-gpu.example.com-x": "resource.k8s.io/v1",
	}
	got := staleVersions(stored)
	want := "/registry/deviceclasses/gpu.example.com (resource.k8s.io/v1beta2), /registry/resourceclaimtemplates/ns/example (resource.k8s.io/v1beta1)"
	if strings.Join(got, ", ") != want {
		t.Errorf("staleVersions = %q, want %q", got, want)
	}
}

// TestCheckVerdict: what the scenario takes for preflight's "safe" and "not safe".
func TestCheckVerdict(t *testing.T) {
	for _, tc := range []struct {
		out  string
		code int
		safe bool
		ok   bool
	}{
		{"Upgrade to Kubernetes 1.38: SAFE\n\nStored objects  SAFE\n", 0, true, true},
		{"Upgrade to Kubernetes 1.38: NOT SAFE\n\nStored objects  NOT SAFE\n", 2, false, true},
		{"Upgrade to Kubernetes 1.38: NOT SAFE\n", 2, true, false},
		{"Upgrade to Kubernetes 1.38: SAFE\n", 0, false, false},
		{"Upgrade to Kubernetes 1.38: UNKNOWN\n", 3, false, false},
		{"Upgrade to Kubernetes 1.38: SAFE\n", 2, true, false},
		{"Upgrade to Kubernetes 1.38: SAFE\n\nClients  NOT SAFE\n", 0, true, true},
	} {
		if err := checkVerdict(tc.out, tc.code, tc.safe); (err == nil) != tc.ok {
			t.Errorf("checkVerdict(%q, exit %d, safe %v) = %v, want ok %v", tc.out, tc.code, tc.safe, err, tc.ok)
		}
	}
}
