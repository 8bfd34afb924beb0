package claimvalidation

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

const driverName = "gpu.example.com"

type nodeSpec struct {
	Name     string `json:"name"`
	GPUs     int    `json:"gpus"`
	Model    string `json:"model"`
	OddModel string `json:"oddModel"`
	Memory   string `json:"memory"`
	NICs     int    `json:"nics"`
}

type inventoryFile struct {
	Nodes   []nodeSpec                `json:"nodes"`
	Classes []resourceapi.DeviceClass `json:"classes"`
}

// gpuSlice is what the driver publishes for one node: one pool, devices gpu-<i>.
func gpuSlice(node string, n int, model, oddModel string, memory resource.Quantity) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + driverName},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driverName,
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
		},
	}
	for i := range n {
		m := model
		if oddModel != "" && i%2 == 1 {
			m = oddModel
		}
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				deviceschema.AttrIndex:         {IntValue: ptr.To(int64(i))},
				deviceschema.AttrUUID:          {StringValue: ptr.To(fmt.Sprintf("gpu-%s-%d", node, i))},
				deviceschema.AttrModel:         {StringValue: ptr.To(m)},
				deviceschema.AttrDriverVersion: {VersionValue: ptr.To(deviceschema.DefaultDriverVersion)},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{deviceschema.CapMemory: {Value: memory}},
		})
	}
	return s
}

func nicSlice(node string, n int) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-nic.example.com"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   "nic.example.com",
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
		},
	}
	for i := range n {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
			Name:       fmt.Sprintf("nic-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"speed": {IntValue: ptr.To(int64(100))}},
		})
	}
	return s
}

// loadInventory reads testdata/inventory.yaml into an in-memory inventory.
func loadInventory(t testing.TB) *inventory.Objects {
	t.Helper()
	data, err := os.ReadFile("testdata/inventory.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f inventoryFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		t.Fatalf("testdata/inventory.yaml: %v", err)
	}
	st := &inventory.Objects{}
	for _, n := range f.Nodes {
		st.Nodes = append(st.Nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}})
		st.Slices = append(st.Slices, gpuSlice(n.Name, n.GPUs, n.Model, n.OddModel, resource.MustParse(n.Memory)))
		if n.NICs > 0 {
			st.Slices = append(st.Slices, nicSlice(n.Name, n.NICs))
		}
	}
	for i := range f.Classes {
		st.Classes = append(st.Classes, &f.Classes[i])
	}
	return st
}

// newValidator is the validator as gpu-webhook runs it, over lister and the node groups of
// testdata/node-groups.yaml.
func newValidator(t testing.TB, lister feasibility.Lister, deny ...Rule) *Validator {
	t.Helper()
	cfg, err := nodegroups.LoadConfig("testdata/node-groups.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return New(driverName, cfg, deny, lister)
}

// review sends obj (any resource.k8s.io version) as an AdmissionReview through the
// controller-runtime webhook, as the API server would.
func review(t testing.TB, h admission.Handler, obj runtime.Object, op admissionv1.Operation) *admissionv1.AdmissionResponse {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	gvk := obj.GetObjectKind().GroupVersionKind()
	meta := obj.(metav1.Object)
	ar := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID("test"),
			Kind:      metav1.GroupVersionKind{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind},
			Resource:  metav1.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resourceOf(gvk.Kind)},
			Name:      meta.GetName(),
			Namespace: meta.GetNamespace(),
			Operation: op,
			Object:    runtime.RawExtension{Raw: raw},
		},
	}
	if op == admissionv1.Update {
		ar.Request.OldObject = runtime.RawExtension{Raw: raw}
	}
	return post(t, h, ar)
}

func post(t testing.TB, h admission.Handler, ar any) *admissionv1.AdmissionResponse {
	t.Helper()
	body, err := json.Marshal(ar)
	if err != nil {
		t.Fatal(err)
	}
	return postRaw(t, h, body)
}

func postRaw(t testing.TB, h admission.Handler, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	wh := &admission.Webhook{Handler: h}
	req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/validate-resource-claim", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	wh.ServeHTTP(rec, req)
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("response %q: %v", rec.Body.String(), err)
	}
	if out.Response == nil {
		t.Fatalf("no response in %s", rec.Body.String())
	}
	return out.Response
}

func resourceOf(kind string) string {
	if kind == "ResourceClaimTemplate" {
		return "resourceclaimtemplates"
	}
	return "resourceclaims"
}
