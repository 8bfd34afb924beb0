package inventory

import (
	"encoding/json"
	"fmt"
	runtimego "runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/allocs"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
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
	c := got.(*Claim)
	if c.Name != "c" || c.Namespace != "ns" || c.UID() != "u" || c.ResourceVersion() != "7" || !c.Allocated {
		t.Errorf("claim %+v", c)
	}
	if m := c.GetObjectMeta(); m.GetName() != "c" || m.GetNamespace() != "ns" || m.GetResourceVersion() != "7" {
		t.Errorf("object meta %+v", m)
	}
	r := c.Results[0]
	if r.Device != "gpu-0" || r.Pool != "n" || r.Driver != "gpu.example.com" || r.Request != "gpu" || ptr.Deref(r.ShareID, "") != share ||
		!r.ConsumedCapacity["memory"].Equal(resource.MustParse("30Gi")) {
		t.Errorf("result %+v", r)
	}
	if len(c.ReservedFor) != maxReservedKept || c.ReservedFor[0].Name != "p0" || c.ReservedFor[0].UID != "" {
		t.Errorf("reservedFor %+v, want the first %d names", c.ReservedFor, maxReservedKept)
	}
	if full.Status.Allocation.Devices.Results[0].Tolerations == nil {
		t.Error("the transform changed its input")
	}
	pending, _ := TransformClaim(&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: full.Spec})
	if p := pending.(*Claim); p.Allocated || p.Results != nil {
		t.Errorf("pending claim %+v", p)
	}
}

// TestTransformClaimPending: the creation time is kept, and whether a Pod controls a claim without
// an allocation (what the fleet metrics tell pending claims by).
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
			c := out.(*Claim)
			if c.Created != created.UnixNano() {
				t.Errorf("created %v, want %v", time.Unix(0, c.Created), created)
			}
			if c.PodOwned != (tc.wantOwner != "") {
				t.Errorf("pod owned %t, want %t", c.PodOwned, tc.wantOwner != "")
			}
		})
	}
	tombstone := tombstoneObject()
	if out, _ := TransformClaim(tombstone); out != tombstone {
		t.Error("a tombstone was changed")
	}
}

func tombstoneObject() runtime.Object { return &metav1.Status{} }

// TestKeptClaimBounded: what the informer keeps of an allocated claim of one device is a few
// small objects whatever the claim held besides, and claims of one node share the names of its
// driver, pool and devices.
func TestKeptClaimBounded(t *testing.T) {
	claim := func(i int) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c-%d", i), Namespace: "team-a", UID: types.UID(fmt.Sprintf("uid-%d", i)), ResourceVersion: "7",
				Annotations: map[string]string{"note": strings.Repeat("x", 4096)}},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu"}}}},
			Status: resourceapi.ResourceClaimStatus{
				Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
					Request: "gpu", Driver: strings.Clone("gpu.example.com"), Pool: strings.Clone("node-00001"), Device: strings.Clone("gpu-3")}}}},
				ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: fmt.Sprintf("p-%d", i), UID: "u"}},
			},
		}
	}
	a, b := transformClaim(claim(1)), transformClaim(claim(2))
	for _, pair := range [][2]string{{a.Namespace, b.Namespace}, {a.Results[0].Driver, b.Results[0].Driver},
		{a.Results[0].Pool, b.Results[0].Pool}, {a.Results[0].Device, b.Results[0].Device}} {
		if unsafe.StringData(pair[0]) != unsafe.StringData(pair[1]) {
			t.Errorf("%q is held twice", pair[0])
		}
	}
	// The claim, its result, its consumer and its strings kept, and the ids they were copied
	// from: five allocations, as long as the interned names are held (by a and b here).
	c := claim(3)
	if n := testing.AllocsPerRun(100, func() { transformClaim(c) }); n > 5 {
		t.Errorf("keeping a claim allocates %v times, want at most 5", n)
	}
	if size := unsafe.Sizeof(Claim{}) + unsafe.Sizeof(deviceusage.Result{}); size > 256 {
		t.Errorf("a kept claim of one device is %d bytes before its names, want at most 256", size)
	}
}

// keptClaimBytes bounds the heap a kept claim of one device and one consuming pod holds, its
// names decoded as the informer decodes them (each string an allocation of its own): its uid,
// resourceVersion, name and consumer's name in one allocation, the rest as TestKeptClaimBounded
// counts.
const keptClaimBytes = 380

// TestKeptClaimHeapBounded: at 40,000 claims every byte a kept claim holds is 40 kB of the
// webhook's heap, which the collector scans on every cycle.
func TestKeptClaimHeapBounded(t *testing.T) {
	const n = 2000
	docs := make([][]byte, n)
	for i := range docs {
		docs[i] = []byte(fmt.Sprintf(`{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"training-job-%d-gpu",`+
			`"namespace":"team-a","uid":"3f1c9a2e-7b4d-4e8a-9c61-%012d","resourceVersion":"%d","creationTimestamp":"2026-01-02T03:04:05Z"},`+
			`"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu.example.com"}}]}},`+
			`"status":{"allocation":{"devices":{"results":[{"request":"gpu","driver":"gpu.example.com","pool":"node-%04d","device":"gpu-%d"}]}},`+
			`"reservedFor":[{"resource":"pods","name":"training-job-%d-worker","uid":"9d0e6f1a-2b3c-4d5e-8f70-%012d"}]}}`,
			i, i, 1000000+i, i/8, i%8, i, i))
	}
	decode := func(doc []byte) *resourceapi.ResourceClaim {
		c := &resourceapi.ResourceClaim{}
		if err := json.Unmarshal(doc, c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// The names all claims share are interned before the count starts.
	first := transformClaim(decode(docs[0]))
	kept := make([]*Claim, n)
	held := allocs.Retained(func() any {
		for i, doc := range docs {
			kept[i] = transformClaim(decode(doc))
		}
		return kept
	})
	if per := held / n; per > keptClaimBytes {
		t.Errorf("a kept claim holds %d bytes of heap, want at most %d", per, keptClaimBytes)
	} else {
		t.Logf("a kept claim holds %d bytes of heap", per)
	}
	runtimego.KeepAlive(first)
	runtimego.KeepAlive(docs)
}
