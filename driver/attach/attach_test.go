package attach

import (
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra/driver/faults"
)

const (
	driver = "gpu.example.com"
	node   = "node-a"
)

var allocatedAt = metav1.NewTime(time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC))

func result(pool, device string, conditions ...string) resourceapi.DeviceRequestAllocationResult {
	r := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: driver, Pool: pool, Device: device}
	if len(conditions) > 0 {
		r.BindingConditions, r.BindingFailureConditions = conditions, []string{"AttachFailed"}
	}
	return r
}

func claim(results []resourceapi.DeviceRequestAllocationResult, status ...resourceapi.AllocatedDeviceStatus) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: types.UID("uid-1")},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}, AllocationTimestamp: &allocatedAt},
			Devices:    status,
		},
	}
}

func condition(ty string, status metav1.ConditionStatus) resourceapi.AllocatedDeviceStatus {
	return resourceapi.AllocatedDeviceStatus{Driver: driver, Pool: node, Device: "gpu-0",
		Conditions: []metav1.Condition{{Type: ty, Status: status, Reason: "R", LastTransitionTime: allocatedAt}}}
}

func TestPending(t *testing.T) {
	other := result(node, "gpu-1", "Attached")
	other.Driver = "other.example.com"
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{"unallocated", &resourceapi.ResourceClaim{}, "[]"},
		{"allocated, not attachable", claim([]resourceapi.DeviceRequestAllocationResult{result(node, "gpu-0")}), "[]"},
		{"attachable on this node", claim([]resourceapi.DeviceRequestAllocationResult{result(node, "gpu-0", "Attached")}), "[gpu-0]"},
		{"attachable on another node", claim([]resourceapi.DeviceRequestAllocationResult{result("node-b", "gpu-0", "Attached")}), "[]"},
		{"another driver's", claim([]resourceapi.DeviceRequestAllocationResult{other}), "[]"},
		{"attached", claim([]resourceapi.DeviceRequestAllocationResult{result(node, "gpu-0", "Attached")}, condition("Attached", metav1.ConditionTrue)), "[]"},
		{"failed", claim([]resourceapi.DeviceRequestAllocationResult{result(node, "gpu-0", "Attached")}, condition("AttachFailed", metav1.ConditionTrue)), "[]"},
		{"condition False", claim([]resourceapi.DeviceRequestAllocationResult{result(node, "gpu-0", "Attached")}, condition("Attached", metav1.ConditionFalse)), "[gpu-0]"},
		{"one of two attached", claim([]resourceapi.DeviceRequestAllocationResult{result(node, "gpu-0", "Attached"), result(node, "gpu-3", "Attached")},
			condition("Attached", metav1.ConditionTrue)), "[gpu-3]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, p := range Pending(tc.claim, driver, node) {
				got = append(got, p.Device)
			}
			if s := fmt.Sprint(got); s != tc.want {
				t.Errorf("Pending = %s, want %s", s, tc.want)
			}
		})
	}
	deleting := claim([]resourceapi.DeviceRequestAllocationResult{result(node, "gpu-0", "Attached")})
	deleting.DeletionTimestamp = &allocatedAt
	if p := Pending(deleting, driver, node); len(p) != 0 {
		t.Errorf("a claim being deleted waits for attaches %v", p)
	}
}

func TestOutcome(t *testing.T) {
	target := Target{Pool: node, Device: "gpu-0", Conditions: []string{"Attached"}, FailureConditions: []string{"AttachFailed"}}
	now := allocatedAt.Add(2*time.Second + 300*time.Millisecond)
	ok := Outcome(target, node, nil, now)
	if len(ok) != 1 || ok[0].Type != "Attached" || ok[0].Status != metav1.ConditionTrue || ok[0].Reason != ReasonAttached ||
		ok[0].Message != "attached to node node-a" || !ok[0].LastTransitionTime.Equal(&metav1.Time{Time: now.Truncate(time.Second)}) {
		t.Errorf("attach without fault: %+v", ok)
	}
	failed := Outcome(target, node, &faults.Fault{Kind: faults.KindAttachFailure, Message: "link down"}, now)
	if len(failed) != 1 || failed[0].Type != "AttachFailed" || failed[0].Status != metav1.ConditionTrue || failed[0].Reason != ReasonAttachFailed ||
		failed[0].Message != "attaching to node node-a failed: attach-failure: link down" {
		t.Errorf("attach with fault: %+v", failed)
	}
	if d := Due(claim(nil), 5*time.Second); !d.Equal(allocatedAt.Add(5 * time.Second)) {
		t.Errorf("Due = %v, want the allocation's time plus the delay", d)
	}
}

// TestSync: a pending device is attached once due (not before), with a failure while it has an
// attach-failure fault; other drivers' entries and this claim's other results are not touched.
func TestSync(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fault     faults.Faults
		want      string
		wantAfter time.Duration
		now       time.Duration // after the allocation
	}{
		{name: "not yet due", now: time.Second, wantAfter: 2 * time.Second, want: "[]"},
		{name: "due", now: 3 * time.Second, want: "[Attached=True/Attached]"},
		{name: "due, faulty", now: 3 * time.Second, fault: faults.Faults{"gpu-0": {Kind: faults.KindAttachFailure, Message: "x"}},
			want: "[AttachFailed=True/AttachFailed]"},
		{name: "due, unhealthy but attachable", now: 3 * time.Second, fault: faults.Faults{"gpu-0": {Kind: faults.KindXID}},
			want: "[Attached=True/Attached]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			c := claim([]resourceapi.DeviceRequestAllocationResult{result(node, "gpu-0", "Attached"), result("node-b", "gpu-1", "Attached")})
			cs := fake.NewClientset(c)
			a := New(cs, driver, node, WithDelay(func() time.Duration { return 3 * time.Second }), WithFaults(func() faults.Faults { return tc.fault }))
			a.now = func() time.Time { return allocatedAt.Add(tc.now) }
			if err := a.informer.GetStore().Add(a.keep(c)); err != nil {
				t.Fatal(err)
			}
			after, err := a.sync(ctx, cache.MetaObjectToName(c))
			if err != nil || after != tc.wantAfter {
				t.Fatalf("sync = %v, %v; want %v, nil", after, err, tc.wantAfter)
			}
			got, err := cs.ResourceV1().ResourceClaims("ns").Get(ctx, "c", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var conds []string
			for _, d := range got.Status.Devices {
				if d.Pool != node || d.Device != "gpu-0" || d.Driver != driver {
					t.Errorf("entry for %s/%s/%s written, want only %s/%s/gpu-0", d.Driver, d.Pool, d.Device, driver, node)
				}
				for _, c := range d.Conditions {
					conds = append(conds, fmt.Sprintf("%s=%s/%s", c.Type, c.Status, c.Reason))
				}
			}
			if s := fmt.Sprint(conds); s != tc.want {
				t.Errorf("conditions %s, want %s", s, tc.want)
			}
		})
	}
}

// TestKeep: the cache holds of a claim only this node's results of this driver.
func TestKeep(t *testing.T) {
	a := New(fake.NewClientset(), driver, node)
	c := claim([]resourceapi.DeviceRequestAllocationResult{result(node, "gpu-0", "Attached"), result("node-b", "gpu-1")},
		condition("Attached", metav1.ConditionTrue), resourceapi.AllocatedDeviceStatus{Driver: driver, Pool: "node-b", Device: "gpu-1"})
	c.Labels = map[string]string{"a": "b"}
	kept := a.keep(c)
	if len(kept.Status.Allocation.Devices.Results) != 1 || len(kept.Status.Devices) != 1 || kept.Labels != nil || kept.UID != c.UID {
		t.Errorf("kept %+v", kept)
	}
	if k := a.keep(claim([]resourceapi.DeviceRequestAllocationResult{result("node-b", "gpu-1")})); k.Status.Allocation != nil {
		t.Errorf("another node's claim kept with its allocation: %+v", k)
	}
}

// TestListsInPages: the claims are listed in pages of claimsPageSize at the latest
// resourceVersion, following the continue token, and each claim is cached as kept (its labels and other nodes' results gone).
func TestListsInPages(t *testing.T) {
	cs := fake.NewClientset()
	var limits []string
	cs.PrependReactor("list", "resourceclaims", func(action k8stesting.Action) (bool, runtime.Object, error) {
		o := action.(k8stesting.ListActionImpl).GetListOptions()
		limits = append(limits, fmt.Sprintf("%d@%q", o.Limit, o.ResourceVersion))
		c := claim([]resourceapi.DeviceRequestAllocationResult{result(node, "gpu-0"), result("node-b", "gpu-1")})
		c.Labels = map[string]string{"big": "label"}
		list := &resourceapi.ResourceClaimList{ListMeta: metav1.ListMeta{ResourceVersion: "7"}}
		if o.Continue == "" {
			c.Name, c.UID = "first", "uid-first"
			list.Continue = "page-2"
		} else {
			c.Name, c.UID = "second", "uid-second"
		}
		list.Items = append(list.Items, *c)
		return true, list, nil
	})
	a := New(cs, driver, node)
	ctx := t.Context()
	go a.informer.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), a.informer.HasSynced) {
		t.Fatal("claims not synced")
	}
	// resourceVersion "0" would let the API server answer from its cache with every claim at
	// once, whatever the limit.
	if want := fmt.Sprintf("[%d@\"\" %d@\"\"]", claimsPageSize, claimsPageSize); fmt.Sprint(limits) != want {
		t.Errorf("lists (limit@resourceVersion) %v, want %s: two pages of the latest", limits, want)
	}
	got := a.informer.GetStore().List()
	if len(got) != 2 {
		t.Fatalf("cached %d claims, want both pages' 2", len(got))
	}
	for _, obj := range got {
		c := obj.(*resourceapi.ResourceClaim)
		if c.Labels != nil || len(c.Status.Allocation.Devices.Results) != 1 {
			t.Errorf("claim %s cached as %+v, want it kept", c.Name, c)
		}
	}
}
