package diagnosis

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility/feasibilitytest"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// holding is a claim allocated the given devices of one node's pool.
func holding(name, node string, devices ...int) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "busy", Name: name}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "g", Driver: feasibilitytest.Driver, Pool: node, Device: fmt.Sprintf("gpu-%d", d)})
	}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name + "-pod", UID: "uid-" + "name"}}
	return c
}

// busyCluster is testCluster with allocations and a DeviceTaintRule (see testdata/diagnose.yaml).
func busyCluster() (*inventory.Objects, *deviceusage.Fleet) {
	st := feasibilitytest.Cluster()
	all := []int{0, 1, 2, 3, 4, 5, 6, 7}
	fl := deviceusage.Build(deviceusage.Input{
		Slices: st.Slices,
		Claims: []*resourceapi.ResourceClaim{holding("a", "n0", 0, 1, 2, 3, 4, 5), holding("b", "n2", all...), holding("c", "n4", all...), holding("d", "n8", all...)},
		TaintRules: []*resourceapi.DeviceTaintRule{{ObjectMeta: metav1.ObjectMeta{Name: "n6-maintenance"}, Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{Pool: ptr.To("n6")},
			Taint:          resourceapi.DeviceTaint{Key: "maintenance", Effect: resourceapi.DeviceTaintEffectNoSchedule},
		}}},
	})
	return &inventory.Objects{Slices: fl.Slices, Classes: st.Classes, Nodes: st.Nodes}, fl
}

type diagnoseCase struct {
	Name        string                        `json:"name"`
	Allocatable bool                          `json:"allocatable"`
	Causes      []Cause                       `json:"causes"`
	Spec        resourceapi.ResourceClaimSpec `json:"spec"`
}

func TestDiagnoseAgreesWithAllocator(t *testing.T) {
	ctx := context.Background()
	st, fl := busyCluster()
	view := feasibility.New(st, celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema()))
	for _, tc := range feasibilitytest.LoadCases[diagnoseCase](t, "diagnose.yaml") {
		t.Run(tc.Name, func(t *testing.T) {
			spec := tc.Spec.DeepCopy()
			resourceversion.Default(spec)
			if got := feasibilitytest.AllocatableWith(ctx, t, st, fl.AllocatedState(), spec); got != tc.Allocatable {
				t.Fatalf("test data is wrong: the allocator says allocatable=%t", got)
			}
			d, err := Diagnose(ctx, view, "default", spec, fl)
			if err != nil {
				t.Fatal(err)
			}
			var causes []Cause
			var text []string
			for _, r := range d.Requests {
				for _, f := range r.Findings {
					causes = append(causes, f.Cause)
					text = append(text, r.Name+": "+f.Message+" | "+strings.Join(f.Details, " | ")+" | fix: "+f.Fix)
				}
			}
			for _, f := range d.Findings {
				causes = append(causes, f.Cause)
				text = append(text, "claim: "+f.Message+" | fix: "+f.Fix)
			}
			if d.Allocatable != tc.Allocatable || !slices.Equal(causes, tc.Causes) {
				t.Errorf("allocatable %t, causes %v; want %t, %v\n%s", d.Allocatable, causes, tc.Allocatable, tc.Causes, strings.Join(text, "\n"))
			}
		})
	}
}

// TestDiagnoseMessages pins the wording people and the e2e test read.
func TestDiagnoseMessages(t *testing.T) {
	ctx := context.Background()
	st, fl := busyCluster()
	view := feasibility.New(st, celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema()))
	latest := resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.example.com"].model == "LATEST-GPU-MODEL"`}}
	for _, tc := range []struct {
		name string
		spec resourceapi.ResourceClaimSpec
		want []string
	}{
		{"held", spec(resourceapi.ExactDeviceRequest{DeviceClassName: "gpu", Count: 3, Selectors: []resourceapi.DeviceSelector{latest}}), []string{
			"DevicesAllocated: 30 matching devices on the 5 nodes with enough matching devices are allocated to other claims; best node n0 has 2 available, 3 wanted",
			"held by busy/a (pod busy/a-pod), busy/b (pod busy/b-pod), busy/c (pod busy/c-pod), busy/d (pod busy/d-pod)",
			"fix: wait for the pods holding them to finish, or delete those pods or claims; or request at most 2",
			"DevicesTainted: 8 matching devices on the 5 nodes with enough matching devices have taints the request does not tolerate",
			"maintenance:NoSchedule (DeviceTaintRule n6-maintenance) on 8 devices: n6/gpu-0,",
			`add to the request: tolerations: [{key: "maintenance", operator: Exists, effect: NoSchedule}]`,
		}},
		{"too few", spec(resourceapi.ExactDeviceRequest{DeviceClassName: "gpu", Count: 9}), []string{
			"TooFewDevices: 9 wanted, best node n0 has 8 matching", "fix: request at most 8, or split the work across several claims",
		}},
		{"typo", spec(resourceapi.ExactDeviceRequest{DeviceClassName: "gpu", Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `"LATEST-GPU-MODLE" == device.attributes["gpu.example.com"].model`}}}}), []string{
			`NoMatchingDevice: selector 0 matches none of the 60 devices of DeviceClass "gpu"`,
			`the devices have gpu.example.com/model "LATEST-GPU-MODEL" (42), "OLD-GPU-MODEL" (18)`,
			`fix: no device has gpu.example.com/model "LATEST-GPU-MODLE"; did you mean "LATEST-GPU-MODEL"?`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.spec.DeepCopy()
			resourceversion.Default(s)
			d, err := Diagnose(ctx, view, "default", s, fl)
			if err != nil {
				t.Fatal(err)
			}
			var lines []string
			for _, r := range d.Requests {
				for _, f := range r.Findings {
					lines = append(lines, string(f.Cause)+": "+f.Message)
					lines = append(lines, f.Details...)
					lines = append(lines, "fix: "+f.Fix)
				}
			}
			text := strings.Join(lines, "\n")
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("missing %q in\n%s", w, text)
				}
			}
		})
	}
}

func spec(r resourceapi.ExactDeviceRequest) resourceapi.ResourceClaimSpec {
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "g", Exactly: &r}}}}
}

// TestDiagnoseMalformed: a spec the API server refuses (a --cluster-state file can hold one) gets
// an error naming the field, not a diagnosis (two requests named alike were called allocatable)
// and no allocator run, which assumes a validated claim.
func TestDiagnoseMalformed(t *testing.T) {
	ctx := context.Background()
	st, fl := busyCluster()
	view := feasibility.New(st, celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema()))
	one := func(name string) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu"}}
	}
	for _, tc := range []struct {
		name string
		spec resourceapi.DeviceClaim
		want string
	}{
		{"duplicate request", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{one("g"), one("g")}},
			`spec.devices.requests[1].name: duplicate name "g"`},
		{"duplicate request with a constraint", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{one("g"), one("g")},
			Constraints: []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("gpu.example.com/uuid"))}}},
			`spec.devices.requests[1].name: duplicate name "g"`},
		{"constraint names nothing", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{one("g")},
			Constraints: []resourceapi.DeviceConstraint{{Requests: []string{"h"}, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("gpu.example.com/uuid"))}}},
			`spec.devices.constraints[0].requests[0]: no request named "h"`},
		{"neither exactly nor firstAvailable", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "g"}}},
			"spec.devices.requests[0]: exactly one of exactly and firstAvailable must be set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &resourceapi.ResourceClaimSpec{Devices: tc.spec}
			resourceversion.Default(s)
			d, err := Diagnose(ctx, view, "default", s, fl)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %+v, %v; want an error containing %q", d, err, tc.want)
			}
		})
	}
}
