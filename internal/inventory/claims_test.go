package inventory

import (
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func TestTransformClaim(t *testing.T) {
	share := types.UID("share-1")
	full := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "u", ResourceVersion: "7", Labels: map[string]string{"a": "b"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-scheduler"}}},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu"}}}},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{
				Devices: resourceapi.DeviceAllocationResult{
					Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: "gpu.example.com", Pool: "n", Device: "gpu-0", ShareID: &share,
						ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("30Gi")},
						Tolerations:      []resourceapi.DeviceToleration{{Key: "k"}}, BindingConditions: []string{"x"}}},
					Config: []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClaim}},
				},
			},
			Devices: []resourceapi.AllocatedDeviceStatus{{Driver: "gpu.example.com", Pool: "n", Device: "gpu-0"}},
		},
	}
	for i := range 300 {
		full.Status.ReservedFor = append(full.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: fmt.Sprintf("p%d", i), UID: "u"})
	}
	got, err := TransformClaim(full)
	if err != nil {
		t.Fatal(err)
	}
	c := got.(*resourceapi.ResourceClaim)
	if c.Name != "c" || c.Namespace != "ns" || c.UID != "u" || c.ResourceVersion != "7" || c.Labels != nil || c.ManagedFields != nil {
		t.Errorf("metadata %+v", c.ObjectMeta)
	}
	if len(c.Spec.Devices.Requests) != 0 || c.Status.Devices != nil || len(c.Status.Allocation.Devices.Config) != 0 {
		t.Errorf("kept what nothing reads: %+v", c)
	}
	r := c.Status.Allocation.Devices.Results[0]
	if r.Device != "gpu-0" || r.Pool != "n" || r.Driver != "gpu.example.com" || r.Request != "gpu" || ptr.Deref(r.ShareID, "") != share ||
		!r.ConsumedCapacity["memory"].Equal(resource.MustParse("30Gi")) || r.Tolerations != nil || r.BindingConditions != nil {
		t.Errorf("result %+v", r)
	}
	if len(c.Status.ReservedFor) != maxReservedKept || c.Status.ReservedFor[0].Name != "p0" || c.Status.ReservedFor[0].UID != "" {
		t.Errorf("reservedFor %+v, want the first %d names", c.Status.ReservedFor, maxReservedKept)
	}
	if full.Status.Allocation.Devices.Results[0].Tolerations == nil {
		t.Error("the transform changed its input")
	}
	pending, _ := TransformClaim(&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: full.Spec})
	if p := pending.(*resourceapi.ResourceClaim); p.Status.Allocation != nil || len(p.Spec.Devices.Requests) != 0 {
		t.Errorf("pending claim %+v", p)
	}
}

// TestTransformClaimPending: the creation time is kept, and the controlling Pod of a claim without
// an allocation (what the fleet metrics tell pending claims by), and nothing else of the owners.
func TestTransformClaimPending(t *testing.T) {
	created := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	podRef := metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "p", UID: "pod-uid", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}
	allocation := &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: "d", Pool: "n", Device: "gpu-0"}}}}
	for _, tc := range []struct {
		name       string
		owners     []metav1.OwnerReference
		allocation *resourceapi.AllocationResult
		wantOwner  string
	}{
		{name: "pod's template claim", owners: []metav1.OwnerReference{podRef}, wantOwner: "p"},
		{name: "allocated", owners: []metav1.OwnerReference{podRef}, allocation: allocation},
		{name: "standalone"},
		{name: "owned but not controlled", owners: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "p", UID: "pod-uid"}}},
		{name: "controlled by something else", owners: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "r", UID: "u", Controller: ptr.To(true)}}},
		{name: "a Pod kind of another group", owners: []metav1.OwnerReference{{APIVersion: "example.com/v1", Kind: "Pod", Name: "p", UID: "u", Controller: ptr.To(true)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", CreationTimestamp: created, OwnerReferences: tc.owners},
				Status: resourceapi.ResourceClaimStatus{Allocation: tc.allocation}}
			out, _ := TransformClaim(in)
			c := out.(*resourceapi.ResourceClaim)
			if !c.CreationTimestamp.Equal(&created) {
				t.Errorf("creationTimestamp %v, want %v", c.CreationTimestamp, created)
			}
			owner := metav1.GetControllerOfNoCopy(c)
			switch {
			case tc.wantOwner == "" && len(c.OwnerReferences) > 0:
				t.Errorf("owners %+v, want none", c.OwnerReferences)
			case tc.wantOwner != "" && (owner == nil || owner.Kind != "Pod" || owner.Name != tc.wantOwner || owner.UID != "pod-uid" || len(c.OwnerReferences) != 1):
				t.Errorf("owners %+v, want the controlling Pod %s", c.OwnerReferences, tc.wantOwner)
			}
		})
	}
	tombstone := tombstoneObject()
	if out, _ := TransformClaim(tombstone); out != tombstone {
		t.Error("a tombstone was changed")
	}
}

func tombstoneObject() runtime.Object { return &metav1.Status{} }
