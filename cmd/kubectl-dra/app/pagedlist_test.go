package app

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	draclient "k8s.io/dynamic-resource-allocation/client"
)

// fakePages serves a list of n objects in the pages each request asks for, with continue tokens
// of its own, answering 410 Gone to the continuations listed in expire (counted from 1 over all
// requests), and records each request's options.
type fakePages struct {
	n      int
	item   func(i int) runtime.Object
	list   func(items []runtime.Object, cont string) runtime.Object
	expire map[int]bool

	mu       sync.Mutex
	requests []metav1.ListOptions
}

func (f *fakePages) react(action k8stesting.Action) (bool, runtime.Object, error) {
	o := action.(k8stesting.ListActionImpl).ListOptions
	f.mu.Lock()
	f.requests = append(f.requests, o)
	n := len(f.requests)
	f.mu.Unlock()
	if o.Continue != "" && f.expire[n] {
		return true, nil, apierrors.NewResourceExpired("The provided continue parameter is too old to display a consistent list result.")
	}
	from := 0
	if o.Continue != "" {
		var err error
		if from, err = strconv.Atoi(strings.TrimPrefix(o.Continue, "at-")); err != nil {
			return true, nil, apierrors.NewBadRequest("continue: " + err.Error())
		}
	}
	to := f.n
	if o.Limit > 0 {
		to = min(f.n, from+int(o.Limit))
	}
	var items []runtime.Object
	for i := from; i < to; i++ {
		items = append(items, f.item(i))
	}
	cont := ""
	if to < f.n {
		cont = fmt.Sprintf("at-%d", to)
	}
	return true, f.list(items, cont), nil
}

func fakeClaims(n int, expire ...int) *fakePages {
	f := &fakePages{n: n, expire: map[int]bool{}}
	for _, e := range expire {
		f.expire[e] = true
	}
	f.item = func(i int) runtime.Object {
		return &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("claim-%05d", i), Annotations: map[string]string{"big": strings.Repeat("x", 100)}},
			Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: "gpu.example.com", Pool: "node", Device: fmt.Sprintf("gpu-%d", i)}}}}},
		}
	}
	f.list = func(items []runtime.Object, cont string) runtime.Object {
		l := &resourceapi.ResourceClaimList{ListMeta: metav1.ListMeta{Continue: cont}}
		for _, it := range items {
			l.Items = append(l.Items, *it.(*resourceapi.ResourceClaim))
		}
		return l
	}
	return f
}

func fakeSlices(n int) *fakePages {
	f := &fakePages{n: n}
	f.item = func(i int) runtime.Object {
		return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("slice-%05d", i)},
			Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.example.com", Pool: resourceapi.ResourcePool{Name: fmt.Sprintf("node-%d", i)}, NodeName: new(fmt.Sprintf("node-%d", i))}}
	}
	f.list = func(items []runtime.Object, cont string) runtime.Object {
		l := &resourceapi.ResourceSliceList{ListMeta: metav1.ListMeta{Continue: cont}}
		for _, it := range items {
			l.Items = append(l.Items, *it.(*resourceapi.ResourceSlice))
		}
		return l
	}
	return f
}

// TestListPages: status reads every claim and slice of a cluster that serves them in pages,
// asking for pages of 5,000 claims and 1,000 slices with resourceVersion "" (what the watch cache
// serves pages of from 1.34), following each continue token, and starting a list over once when
// its token expires.
func TestListPages(t *testing.T) {
	for _, tc := range []struct {
		name   string
		claims *fakePages
		// wantClaimRequests is how many list requests the claims take.
		wantClaimRequests int
		wantErr, wantNote string
	}{
		{name: "pages followed", claims: fakeClaims(10340), wantClaimRequests: 3},
		{name: "exact multiple of the page", claims: fakeClaims(10000), wantClaimRequests: 2},
		{name: "expired token restarts once", claims: fakeClaims(10340, 2), wantClaimRequests: 2 + 3,
			wantNote: "kubectl dra: listing ResourceClaims again: the list changed too much between two pages"},
		{name: "expired twice is an error", claims: fakeClaims(10340, 2, 4), wantClaimRequests: 4,
			wantErr: "list ResourceClaims in all namespaces: The provided continue parameter is too old"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slices := fakeSlices(2001)
			cs := fake.NewClientset()
			cs.PrependReactor("list", "resourceclaims", tc.claims.react)
			cs.PrependReactor("list", "resourceslices", slices.react)
			c := &readClient{cs: cs, dra: draclient.New(cs)}
			var errOut bytes.Buffer
			state, _, err := c.list(context.Background(), listOptions{claims: true}, &errOut)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if got := len(tc.claims.requests); got != tc.wantClaimRequests {
				t.Errorf("%d claim list requests, want %d", got, tc.wantClaimRequests)
			}
			for _, f := range []struct {
				pages *fakePages
				limit int64
			}{{tc.claims, 5000}, {slices, 1000}} {
				for i, o := range f.pages.requests {
					if o.Limit != f.limit || o.ResourceVersion != "" || o.ResourceVersionMatch != "" {
						t.Errorf("request %d: limit %d, resourceVersion %q, match %q; want limit %d from the watch cache's consistent read", i, o.Limit, o.ResourceVersion, o.ResourceVersionMatch, f.limit)
					}
				}
			}
			if tc.wantNote != "" && !strings.Contains(errOut.String(), tc.wantNote) {
				t.Errorf("stderr %q lacks %q", errOut.String(), tc.wantNote)
			}
			if tc.wantErr != "" {
				return
			}
			if len(state.Slices) != slices.n || len(slices.requests) != 3 {
				t.Errorf("%d slices in %d requests, want %d in 3", len(state.Slices), len(slices.requests), slices.n)
			}
			seen := map[string]bool{}
			for _, cl := range state.Kept {
				if seen[cl.Name] {
					t.Errorf("claim %s read twice", cl.Name)
				}
				seen[cl.Name] = true
				if !cl.Allocated || len(cl.Results) != 1 {
					t.Fatalf("claim %s: allocated %t with %d results; want its allocation kept", cl.Name, cl.Allocated, len(cl.Results))
				}
			}
			if len(seen) != tc.claims.n {
				t.Errorf("%d claims read, want %d", len(seen), tc.claims.n)
			}
		})
	}
}
