package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
)

// claimVariety are claims with everything a list of claims may hold: an allocation of several
// results (admin access, a share of a device with consumed capacity, tolerations), consumers of
// both kinds, a deletion under way, labels, annotations, managedFields, the driver's device
// status; and a claim without an allocation.
func claimVariety() []resourceapi.ResourceClaim {
	at := metav1.NewTime(time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC))
	spec := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.example.com", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2}}}}}
	meta := func(ns, name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), ResourceVersion: "42", Generation: 3, CreationTimestamp: at,
			Labels: map[string]string{"app": "x"}, Annotations: map[string]string{"note": strings.Repeat("y", 300)},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-scheduler", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "resource.k8s.io/v1",
				Time: &at, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:allocation":{}}}`), Subresource: "status"}}}
	}
	held := resourceapi.ResourceClaim{ObjectMeta: meta("team-a", "held"), Spec: spec, Status: resourceapi.ResourceClaimStatus{
		Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{
					{Request: "gpu", Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-0",
						Tolerations: []resourceapi.DeviceToleration{{Key: "maintenance", Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule}}},
					{Request: "gpu", Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-1", AdminAccess: ptr.To(true)},
					{Request: "gpu", Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-2", ShareID: ptr.To(types.UID("share-1")),
						ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi")}},
				},
				Config: []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{"gpu"},
					DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "gpu.example.com",
						Parameters: runtime.RawExtension{Raw: []byte(`{"sharing":"timeSlicing"}`)}}}}},
			},
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-a"}}}}}},
			AllocationTimestamp: &at,
		},
		ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "train-0", UID: "pod-uid"},
			{APIGroup: "batch", Resource: "jobs", Name: "train", UID: "job-uid"}},
		Devices: []resourceapi.AllocatedDeviceStatus{{Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-0", Data: &runtime.RawExtension{Raw: []byte(`{"temp":40}`)}}},
	}}
	leaving := held
	leaving.ObjectMeta = meta("team-b", "leaving")
	leaving.DeletionTimestamp = &at
	waiting := resourceapi.ResourceClaim{ObjectMeta: meta("team-a", "waiting"), Spec: spec}
	return []resourceapi.ResourceClaim{held, leaving, waiting}
}

func encodedClaimList(t testing.TB, items []resourceapi.ResourceClaim, cont string) []byte {
	t.Helper()
	body, err := encodeProto(&resourceapi.ResourceClaimList{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaimList"},
		ListMeta: metav1.ListMeta{ResourceVersion: "7", Continue: cont}, Items: items}, false)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// TestDecodeClaimList: of a page of claims in protobuf, the command's own decoding gives the
// fleet what it reads of the claims the typed client decodes.
func TestDecodeClaimList(t *testing.T) {
	items := claimVariety()
	list, err := claimListOf(encodedClaimList(t, items, "next-page"))
	if err != nil {
		t.Fatal(err)
	}
	cont, n, err := listContinue(list)
	if err != nil || cont != "next-page" || n != len(items) {
		t.Fatalf("continue %q and %d items (%v), want %q and %d", cont, n, err, "next-page", len(items))
	}
	var got []*deviceusage.Claim
	if _, err := decodeClaimList(list, func(c *deviceusage.Claim) { got = append(got, c) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(items) {
		t.Fatalf("%d claims decoded, want %d", len(got), len(items))
	}
	for i := range items {
		if d := cmp.Diff(deviceusage.ClaimOf(&items[i]), got[i]); d != "" {
			t.Errorf("claim %s (-typed client +decoded):\n%s", items[i].Name, d)
		}
	}
}

// TestClaimListOfRejects: a response that is not a protobuf list of v1 claims is not decoded as
// one: JSON and other kinds are errNotProtobuf (the typed client reads those), a broken message
// is an error.
func TestClaimListOfRejects(t *testing.T) {
	slices, err := encodeProto(&resourceapi.ResourceSliceList{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceSliceList"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	good := encodedClaimList(t, claimVariety(), "")
	for _, tc := range []struct {
		name    string
		body    []byte
		notFrom bool
	}{
		{"json", []byte(`{"kind":"ResourceClaimList","apiVersion":"resource.k8s.io/v1","items":[]}`), true},
		{"other kind", slices, true},
		{"truncated", good[:len(good)/2], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			list, err := claimListOf(tc.body)
			if err == nil {
				_, _, err = listContinue(list)
			}
			if err == nil {
				_, err = decodeClaimList(list, func(*deviceusage.Claim) {})
			}
			if err == nil || errors.Is(err, errNotProtobuf) != tc.notFrom {
				t.Errorf("error %v; want one, errNotProtobuf: %t", err, tc.notFrom)
			}
		})
	}
}

// TestClaimPages: the command reads every claim of a server that serves them in protobuf pages
// of 5,000, in order, asks for the next page while it decodes the last one, and starts the list
// over once when a continue token expired.
func TestClaimPages(t *testing.T) {
	const n = 12001
	const path = "/apis/resource.k8s.io/v1/resourceclaims"
	for _, tc := range []struct {
		name   string
		expire bool
		// wantRequests are the claim list requests: 3 pages; with the list started over, the first
		// page, the continuation answered 410 Gone, and 3 pages again.
		wantRequests int
	}{
		{"pages followed", false, 3},
		{"expired token restarts once", true, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startProtoServer(t, nil, map[string]*protoList{
				path: {n: n, page: func(from, to int) runtime.Object {
					l := &resourceapi.ResourceClaimList{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaimList"}}
					for i := from; i < to; i++ {
						l.Items = append(l.Items, resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("claim-%05d", i)}})
					}
					return l
				}},
			})
			if tc.expire {
				srv.expireOnce(path)
			}
			requests := func() []string {
				var out []string
				for _, r := range srv.requested() {
					if strings.HasPrefix(r, path+"?") {
						out = append(out, r)
					}
				}
				return out
			}
			c, err := newReadClientForConfig(srv.config())
			if err != nil {
				t.Fatal(err)
			}
			var errOut bytes.Buffer
			p := newProgress(&errOut, time.Hour)
			defer p.stop()
			var got []string
			first := true
			read, err := claimPages(context.Background(), p, c.cs.ResourceV1().RESTClient(), func() { got = nil }, func(cl *deviceusage.Claim) {
				if first {
					first = false
					// The first claim waits for the second page's request.
					for start := time.Now(); len(requests()) < 2; time.Sleep(5 * time.Millisecond) {
						if time.Since(start) > 10*time.Second {
							t.Errorf("the second page was not asked for while the first one was decoded")
							break
						}
					}
				}
				got = append(got, cl.Name)
			})
			if err != nil {
				t.Fatal(err)
			}
			if read != n || len(got) != n {
				t.Fatalf("%d claims read (%d handed over), want %d", read, len(got), n)
			}
			for i, name := range got {
				if want := fmt.Sprintf("claim-%05d", i); name != want {
					t.Fatalf("claim %d is %s, want %s", i, name, want)
				}
			}
			reqs := requests()
			for _, r := range reqs {
				if !strings.HasSuffix(r, "limit=5000") {
					t.Errorf("request %s: want pages of 5000", r)
				}
			}
			if len(reqs) != tc.wantRequests {
				t.Errorf("%d claim list requests, want %d", len(reqs), tc.wantRequests)
			}
			if note := "listing ResourceClaims again"; tc.expire != strings.Contains(errOut.String(), note) {
				t.Errorf("stderr %q: want %q only when a token expired", errOut.String(), note)
			}
		})
	}
}

// TestListClaimsDecodesV1Protobuf: status and why decode the claims of a cluster that serves
// resource.k8s.io/v1 in protobuf themselves, as the fleet reads the claims the typed client
// decodes. (TestListPagesAgainstCluster reads 1.32's v1beta1 claims through the typed client.)
func TestListClaimsDecodesV1Protobuf(t *testing.T) {
	claims := claimVariety()
	srv := startProtoServer(t, nil, map[string]*protoList{
		"/apis/resource.k8s.io/v1/resourceclaims": {n: len(claims), page: func(from, to int) runtime.Object {
			return &resourceapi.ResourceClaimList{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaimList"}, Items: claims[from:to]}
		}},
		"/apis/resource.k8s.io/v1/resourceslices":   emptyList("ResourceSliceList"),
		"/apis/resource.k8s.io/v1/devicetaintrules": emptyList("DeviceTaintRuleList"),
	})
	c, err := newReadClientForConfig(srv.config())
	if err != nil {
		t.Fatal(err)
	}
	var errOut bytes.Buffer
	state, _, err := c.list(context.Background(), listOptions{claims: true}, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	if len(state.Kept) != len(claims) || state.Claims != nil {
		t.Fatalf("%d claims as the fleet reads them and %d objects, want %d and none", len(state.Kept), len(state.Claims), len(claims))
	}
	for i, cl := range state.Kept {
		if d := cmp.Diff(deviceusage.ClaimOf(&claims[i]), cl); d != "" {
			t.Errorf("claim %s (-typed client +decoded):\n%s", cl.Name, d)
		}
	}
}

func emptyList(kind string) *protoList {
	return &protoList{page: func(int, int) runtime.Object {
		var l runtime.Object
		switch kind {
		case "ResourceSliceList":
			l = &resourceapi.ResourceSliceList{}
		default:
			l = &resourceapi.DeviceTaintRuleList{}
		}
		l.GetObjectKind().SetGroupVersionKind(resourceapi.SchemeGroupVersion.WithKind(kind))
		return l
	}}
}

// FuzzDecodeClaimList: whatever bytes come back, decoding a page of claims returns an error or
// claims, never a panic, in time linear in the bytes.
func FuzzDecodeClaimList(f *testing.F) {
	body := encodedClaimList(f, claimVariety(), "next")
	f.Add(body)
	if list, err := claimListOf(body); err == nil {
		f.Add(list)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if list, err := claimListOf(b); err == nil {
			b = list
		}
		if _, _, err := listContinue(b); err != nil {
			return
		}
		_, _ = decodeClaimList(b, func(*deviceusage.Claim) {})
	})
}
