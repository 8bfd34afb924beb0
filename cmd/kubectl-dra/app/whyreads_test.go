package app

import (
	"bytes"
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"
	draclient "k8s.io/dynamic-resource-allocation/client"
)

// TestWhyReadsWhatItNeeds: why gets the claims it is asked about by name and lists the cluster's
// claims (and classes and nodes) only when one of them is to be diagnosed.
func TestWhyReadsWhatItNeeds(t *testing.T) {
	node := "node-a"
	slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node},
		Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.example.com", NodeName: &node, Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "gpu-0"}}}}
	request := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.example.com"}}}}}
	allocated := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "held"}, Spec: request,
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: "gpu.example.com", Pool: node, Device: "gpu-0"}}}}}}
	waiting := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "waiting"}, Spec: request}
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.example.com"}}
	pod := func(claim string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pod-" + claim},
			Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}}}
	}
	for _, tc := range []struct {
		name, kind, target string
		wantListed         []string
		wantOut            string
	}{
		{name: "allocated claim", kind: targetClaim, target: "held", wantListed: []string{"resourceslices"}, wantOut: node},
		{name: "pod of an allocated claim", kind: targetPod, target: "pod-held", wantListed: []string{"resourceslices"}, wantOut: node},
		{name: "claim to diagnose", kind: targetClaim, target: "waiting", wantListed: []string{"deviceclasses", "resourceclaims", "resourceslices"}, wantOut: "DevicesAllocated"},
		{name: "pod of a claim to diagnose", kind: targetPod, target: "pod-waiting", wantListed: []string{"deviceclasses", "resourceclaims", "resourceslices"}, wantOut: "DevicesAllocated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset(slice, allocated, waiting, class, pod("held"), pod("waiting"))
			scheme := metadatafake.NewTestScheme()
			if err := metav1.AddMetaToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			meta := metadatafake.NewSimpleMetadataClient(scheme)
			var out, errOut bytes.Buffer
			o := &whyOptions{streams: genericiooptions.IOStreams{Out: &out, ErrOut: &errOut}, driverName: "gpu.example.com"}
			src := &whySource{namespace: "default", client: &readClient{cs: cs, dra: draclient.New(cs), meta: meta}, errOut: &errOut}
			if err := o.explain(context.Background(), src, tc.kind, tc.target); err != nil {
				t.Fatal(err)
			}
			var listed []string
			for _, a := range cs.Actions() {
				if a.GetVerb() == "list" && a.GetResource().Group == resourceapi.GroupName && a.GetResource().Resource != "devicetaintrules" && !slices.Contains(listed, a.GetResource().Resource) {
					listed = append(listed, a.GetResource().Resource)
				}
			}
			slices.Sort(listed)
			if !slices.Equal(listed, tc.wantListed) {
				t.Errorf("listed %v, want %v", listed, tc.wantListed)
			}
			if !bytes.Contains(out.Bytes(), []byte(tc.wantOut)) {
				t.Errorf("answer lacks %q:\n%s\nstderr:\n%s", tc.wantOut, out.String(), errOut.String())
			}
		})
	}
}
