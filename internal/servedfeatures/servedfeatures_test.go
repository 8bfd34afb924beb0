package servedfeatures

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// fakeTemplates answers each dry-run with answer(template) and counts the calls.
type fakeTemplates struct {
	mu     sync.Mutex
	calls  int
	answer func(*resourceapi.ResourceClaimTemplate) (*resourceapi.ResourceClaimTemplate, error)
}

func (f *fakeTemplates) Create(_ context.Context, t *resourceapi.ResourceClaimTemplate, opts metav1.CreateOptions) (*resourceapi.ResourceClaimTemplate, error) {
	f.mu.Lock()
	f.calls++
	f.mu.Unlock()
	if len(opts.DryRun) != 1 || opts.DryRun[0] != metav1.DryRunAll {
		return nil, errors.New("probe without dryRun: it would store the template")
	}
	return f.answer(t.DeepCopy())
}

// keep answers as a server that keeps every field; drop clears what a gate-off server drops.
func keep(t *resourceapi.ResourceClaimTemplate) (*resourceapi.ResourceClaimTemplate, error) {
	return t, nil
}

func drop(t *resourceapi.ResourceClaimTemplate) (*resourceapi.ResourceClaimTemplate, error) {
	for i := range t.Spec.Spec.Devices.Requests {
		r := &t.Spec.Spec.Devices.Requests[i]
		if r.FirstAvailable != nil {
			// The request is left with neither exactly nor firstAvailable.
			return nil, apierrors.NewInvalid(schema.GroupKind{Group: "resource.k8s.io", Kind: "ResourceClaimTemplate"}, t.Name,
				field.ErrorList{field.Required(field.NewPath("spec", "spec", "devices", "requests").Index(i), "exactly one of `exactly` or `firstAvailable` is required")})
		}
		if r.Exactly != nil {
			r.Exactly.AdminAccess = nil
			r.Exactly.Capacity = nil
		}
	}
	return t, nil
}

func needsLabel(t *resourceapi.ResourceClaimTemplate) (*resourceapi.ResourceClaimTemplate, error) {
	if r := t.Spec.Spec.Devices.Requests[0]; r.Exactly != nil && ptr.Deref(r.Exactly.AdminAccess, false) {
		return nil, apierrors.NewInvalid(schema.GroupKind{Group: "resource.k8s.io", Kind: "ResourceClaimTemplate"}, t.Name,
			field.ErrorList{field.Forbidden(field.NewPath("spec", "spec", "devices", "requests").Index(0).Child("exactly", "adminAccess"),
				"admin access to devices requires the `resource.kubernetes.io/admin-access: true` label on the containing namespace")})
	}
	return t, nil
}

// capture returns a context whose logger writes into the returned buffer.
func capture(t *testing.T) (context.Context, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	cfg := textlogger.NewConfig(textlogger.Output(&buf))
	return klog.NewContext(t.Context(), textlogger.NewLogger(cfg)), &buf
}

func TestProbes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		answer     func(*resourceapi.ResourceClaimTemplate) (*resourceapi.ResourceClaimTemplate, error)
		wantList   bool
		wantAdmin  AdminAccessSupport
		wantCap    bool
		wantLogged []string
	}{
		// 1.32 and 1.33 with default gates.
		{name: "fields dropped", answer: drop, wantList: false, wantAdmin: AdminAccessDropped,
			wantLogged: []string{`does not serve a DRA feature; falling back" feature="DRAPrioritizedList"`, `fallback="deny model lists"`, `feature="DRAAdminAccess"`,
				`does not serve a DRA feature; falling back" feature="DRAConsumableCapacity"`, `lost spec.devices.requests[].exactly.capacity`}},
		// 1.32 with DRAAdminAccess on: no namespace check.
		{name: "fields kept", answer: keep, wantList: true, wantAdmin: AdminAccessServed, wantCap: true,
			wantLogged: []string{`serves a DRA feature" feature="DRAPrioritizedList"`, `serves a DRA feature" feature="DRAAdminAccess"`, `serves a DRA feature" feature="DRAConsumableCapacity"`}},
		// 1.34+: the namespace check refuses the probe in an unlabelled namespace.
		{name: "namespace label required", answer: needsLabel, wantList: true, wantAdmin: AdminAccessNeedsLabel, wantCap: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, logs := capture(t)
			f := &fakeTemplates{answer: tc.answer}
			d := newDetector(f, "gpu-dra", WithFallback(PrioritizedList, "deny model lists"))
			for range 3 {
				list, err := d.PrioritizedList(ctx)
				if err != nil || list != tc.wantList {
					t.Errorf("PrioritizedList = %v, %v; want %v", list, err, tc.wantList)
				}
				admin, err := d.AdminAccess(ctx)
				if err != nil || admin != tc.wantAdmin {
					t.Errorf("AdminAccess = %v, %v; want %v", admin, err, tc.wantAdmin)
				}
				capacity, err := d.ConsumableCapacity(ctx)
				if err != nil || capacity != tc.wantCap {
					t.Errorf("ConsumableCapacity = %v, %v; want %v", capacity, err, tc.wantCap)
				}
			}
			if f.calls != 3 {
				t.Errorf("%d probes for 3 questions each about 3 features, want 3 (cached)", f.calls)
			}
			for _, want := range tc.wantLogged {
				if !strings.Contains(logs.String(), want) {
					t.Errorf("log lacks %q:\n%s", want, logs)
				}
			}
			if n := strings.Count(logs.String(), "\n"); n != 3 {
				t.Errorf("%d log lines, want one per feature:\n%s", n, logs)
			}
		})
	}
}

func TestCacheExpiry(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	served := false
	f := &fakeTemplates{answer: func(t *resourceapi.ResourceClaimTemplate) (*resourceapi.ResourceClaimTemplate, error) {
		if served {
			return keep(t)
		}
		return drop(t)
	}}
	ctx, logs := capture(t)
	d := newDetector(f, "ns", WithClock(clk), WithTTL(time.Minute))
	if got, _ := d.PrioritizedList(ctx); got {
		t.Fatal("served before the upgrade")
	}
	served = true // the API server restarted with the gate on
	clk.SetTime(clk.Now().Add(30 * time.Second))
	if got, _ := d.PrioritizedList(ctx); got {
		t.Error("asked the API server again within the TTL")
	}
	clk.SetTime(clk.Now().Add(time.Minute))
	if got, _ := d.PrioritizedList(ctx); !got {
		t.Error("still not served after the TTL")
	}
	if !strings.Contains(logs.String(), "does not serve") || !strings.Contains(logs.String(), "The API server now serves") {
		t.Errorf("want the fallback and the change logged:\n%s", logs)
	}
}

func TestErrors(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	down := true
	f := &fakeTemplates{answer: func(t *resourceapi.ResourceClaimTemplate) (*resourceapi.ResourceClaimTemplate, error) {
		if down {
			return nil, apierrors.NewServiceUnavailable("etcd is down")
		}
		return keep(t)
	}}
	d := newDetector(f, "ns", WithClock(clk))
	if _, err := d.PrioritizedList(t.Context()); err == nil || !strings.Contains(err.Error(), "etcd is down") {
		t.Fatalf("err = %v, want the API server's", err)
	}
	// Remembered briefly: a burst of requests does not become a burst of probes.
	_, _ = d.PrioritizedList(t.Context())
	if f.calls != 1 {
		t.Errorf("%d probes, want 1 within the error TTL", f.calls)
	}
	down = false
	clk.SetTime(clk.Now().Add(10 * time.Second))
	if got, err := d.PrioritizedList(t.Context()); err != nil || !got {
		t.Errorf("after recovery: %v, %v", got, err)
	}

	// Under a cancelled context nothing is remembered.
	d = newDetector(f, "ns", WithClock(clk))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	down = true
	_, _ = d.PrioritizedList(ctx)
	down = false
	if got, err := d.PrioritizedList(t.Context()); err != nil || !got {
		t.Errorf("answer computed under a cancelled context was cached: %v, %v", got, err)
	}
}

func TestExtendedResources(t *testing.T) {
	ctx, logs := capture(t)
	d := newDetector(&fakeTemplates{answer: keep}, "ns", WithFallback(ExtendedResource, "the pod webhook translates limits"))
	plain := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.example.com"}}
	named := plain.DeepCopy()
	named.Spec.ExtendedResourceName = ptr.To("gpu.example.com/gpu")
	for range 2 {
		if d.ExtendedResources(ctx, []*resourceapi.DeviceClass{plain}) {
			t.Error("served without any class naming an extended resource")
		}
	}
	if !d.ExtendedResources(ctx, []*resourceapi.DeviceClass{plain, named}) {
		t.Error("not served although a stored class kept the field")
	}
	if got := logs.String(); strings.Count(got, "\n") != 2 || !strings.Contains(got, `fallback="the pod webhook translates limits"`) {
		t.Errorf("want the fallback logged once, then the change:\n%s", got)
	}
}

func TestPartitionableDevices(t *testing.T) {
	ctx, logs := capture(t)
	d := newDetector(&fakeTemplates{answer: keep}, "ns", WithFallback(PartitionableDevices, "judge whole GPUs only"))
	plain := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: []resourceapi.Device{{Name: "gpu-0"}}}}
	counters := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{SharedCounters: []resourceapi.CounterSet{{Name: "gpu-0-counters"}}}}
	consumer := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: []resourceapi.Device{{Name: "gpu-0"},
		{Name: "gpu-0-partition-0", ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: "gpu-0-counters"}}}}}}
	for _, tc := range []struct {
		name   string
		slices []*resourceapi.ResourceSlice
		want   bool
	}{
		{"none", nil, false},
		{"whole GPUs only", []*resourceapi.ResourceSlice{plain}, false},
		{"a counter set (1.35+ layout)", []*resourceapi.ResourceSlice{plain, counters}, true},
		{"a device consuming counters", []*resourceapi.ResourceSlice{consumer}, true},
		{"whole GPUs again", []*resourceapi.ResourceSlice{plain}, false},
	} {
		if got := d.PartitionableDevices(ctx, tc.slices); got != tc.want {
			t.Errorf("%s: PartitionableDevices = %v, want %v", tc.name, got, tc.want)
		}
	}
	// Logged at the first answer and at each change: not served, served, not served.
	if got := logs.String(); strings.Count(got, "\n") != 3 || !strings.Contains(got, `fallback="judge whole GPUs only"`) {
		t.Errorf("want each change logged once:\n%s", got)
	}
}
