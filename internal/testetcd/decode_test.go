package testetcd

import (
	"bytes"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
)

// encodeProtobuf encodes obj as kube-apiserver stores it: the protobuf serializer's envelope.
func encodeProtobuf(t *testing.T, obj runtime.Object) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Encode(obj, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestDecode(t *testing.T) {
	meta := metav1.ObjectMeta{Name: "gpu"}
	for _, tc := range []struct {
		name  string
		value []byte
		want  Entry
	}{
		{"protobuf v1beta1", encodeProtobuf(t, &resourcev1beta1.DeviceClass{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1beta1", Kind: "DeviceClass"}, ObjectMeta: meta}),
			Entry{APIVersion: "resource.k8s.io/v1beta1", Kind: "DeviceClass", Encoding: Protobuf}},
		{"protobuf v1", encodeProtobuf(t, &resourcev1.ResourceClaim{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"}, ObjectMeta: meta}),
			Entry{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim", Encoding: Protobuf}},
		{"json", []byte(`{"apiVersion":"example.com/v2","kind":"Widget","metadata":{"name":"w"}}`),
			Entry{APIVersion: "example.com/v2", Kind: "Widget", Encoding: JSON}},
		{"encrypted", []byte("k8s:enc:aescbc:v1:key1:\x00\x01"), Entry{Encoding: Encrypted}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode(tc.value)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("Decode = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDecodeRefusesWhatItCannotRead(t *testing.T) {
	for name, value := range map[string][]byte{
		"empty":              nil,
		"garbage":            []byte("\xff\xfe not an object"),
		"truncated protobuf": []byte("k8s\x00\x0a\xff"),
		"broken json":        []byte(`{"apiVersion":`),
	} {
		t.Run(name, func(t *testing.T) {
			if e, err := Decode(value); err == nil {
				t.Errorf("Decode(%q) = %+v, want an error", value, e)
			}
		})
	}
}

func TestGroup(t *testing.T) {
	for apiVersion, want := range map[string]string{"resource.k8s.io/v1beta1": "resource.k8s.io", "v1": "", "": ""} {
		if got := (Entry{APIVersion: apiVersion}).Group(); got != want {
			t.Errorf("Group of %q = %q, want %q", apiVersion, got, want)
		}
	}
}
