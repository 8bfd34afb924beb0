package podinject

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

// device is a GPU as the driver publishes it.
func device(driver, model, memory string) dracel.Device {
	return dracel.Device{
		Driver: driver,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			deviceschema.AttrModel: {StringValue: ptr.To(model)},
			deviceschema.AttrIndex: {IntValue: ptr.To[int64](0)},
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			deviceschema.CapMemory: {Value: resource.MustParse(memory)},
		},
	}
}

// selects compiles every selector of the template in the scheduler's CEL environment and reports
// whether all of them select the device, as the allocator would.
func selects(t testing.TB, tmpl *resourceapi.ResourceClaimTemplate, dev dracel.Device) bool {
	t.Helper()
	return selectorsMatch(t, tmpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors, dev)
}

// selectorsMatch compiles each selector as the scheduler does and runs it on dev.
func selectorsMatch(t testing.TB, selectors []resourceapi.DeviceSelector, dev dracel.Device) bool {
	t.Helper()
	for _, s := range selectors {
		result := dracel.GetCompiler(dracel.Features{}).CompileCELExpression(s.CEL.Expression, dracel.Options{})
		if result.Error != nil {
			t.Fatalf("selector %q does not compile: %v", s.CEL.Expression, result.Error)
		}
		ok, _, err := result.DeviceMatches(context.Background(), dev)
		if err != nil {
			t.Fatalf("selector %q on %+v: %v", s.CEL.Expression, dev, err)
		}
		if !ok {
			return false
		}
	}
	return true
}

func TestTemplateSelectors(t *testing.T) {
	mem := func(s string) *resource.Quantity { q := resource.MustParse(s); return &q }
	for name, tc := range map[string]struct {
		req       Request
		dev       dracel.Device
		wantMatch bool
	}{
		"any gpu":              {req: Request{Count: 1}, dev: device("gpu.example.com", "LATEST-GPU-MODEL", "80Gi"), wantMatch: true},
		"model matches":        {req: Request{Count: 1, Model: "LATEST-GPU-MODEL"}, dev: device("gpu.example.com", "LATEST-GPU-MODEL", "80Gi"), wantMatch: true},
		"model differs":        {req: Request{Count: 1, Model: "LATEST-GPU"}, dev: device("gpu.example.com", "LATEST-GPU-MODEL", "80Gi"), wantMatch: false},
		"model is exact":       {req: Request{Count: 1, Model: "latest-gpu-model"}, dev: device("gpu.example.com", "LATEST-GPU-MODEL", "80Gi"), wantMatch: false},
		"quote in model":       {req: Request{Count: 1, Model: `A100 "SXM"`}, dev: device("gpu.example.com", `A100 "SXM"`, "80Gi"), wantMatch: true},
		"backslash in model":   {req: Request{Count: 1, Model: `a\"b`}, dev: device("gpu.example.com", `a\"b`, "80Gi"), wantMatch: true},
		"injection attempt":    {req: Request{Count: 1, Model: `x" || true || "`}, dev: device("gpu.example.com", "LATEST-GPU-MODEL", "80Gi"), wantMatch: false},
		"control characters":   {req: Request{Count: 1, Model: "a\nb\tc\x00\x7f"}, dev: device("gpu.example.com", "a\nb\tc\x00\x7f", "80Gi"), wantMatch: true},
		"unicode":              {req: Request{Count: 1, Model: "GPU-ü-\u2028-😀"}, dev: device("gpu.example.com", "GPU-ü-\u2028-😀", "80Gi"), wantMatch: true},
		"memory at least":      {req: Request{Count: 1, Memory: mem("80Gi")}, dev: device("gpu.example.com", "X", "80Gi"), wantMatch: true},
		"memory in other unit": {req: Request{Count: 1, Memory: mem("81920Mi")}, dev: device("gpu.example.com", "X", "80Gi"), wantMatch: true},
		"memory too small":     {req: Request{Count: 1, Memory: mem("81Gi")}, dev: device("gpu.example.com", "X", "80Gi"), wantMatch: false},
		"decimal memory":       {req: Request{Count: 1, Memory: mem("85G")}, dev: device("gpu.example.com", "X", "80Gi"), wantMatch: true},
		"model and memory":     {req: Request{Count: 4, Model: "X", Memory: mem("40Gi")}, dev: device("gpu.example.com", "X", "80Gi"), wantMatch: true},
	} {
		t.Run(name, func(t *testing.T) {
			o, err := newOptions(nil)
			if err != nil {
				t.Fatal(err)
			}
			tmpl, err := o.template("ns", tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if got := selects(t, tmpl, tc.dev); got != tc.wantMatch {
				t.Errorf("selectors %v select %+v: %v, want %v", tmpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors, tc.dev.Attributes, got, tc.wantMatch)
			}
			checkTemplateShape(t, o, tmpl, tc.req)
		})
	}
}

func checkTemplateShape(t *testing.T, o options, tmpl *resourceapi.ResourceClaimTemplate, req Request) {
	t.Helper()
	if errs := validation.IsDNS1123Subdomain(tmpl.Name); len(errs) > 0 {
		t.Errorf("name %q: %v", tmpl.Name, errs)
	}
	if tmpl.Labels[ManagedByLabel] != ManagedBy {
		t.Errorf("labels %v lack %s=%s", tmpl.Labels, ManagedByLabel, ManagedBy)
	}
	reqs := tmpl.Spec.Spec.Devices.Requests
	if len(reqs) != 1 || reqs[0].Name != RequestName || reqs[0].Exactly == nil {
		t.Fatalf("requests %+v, want one exactly request %q", reqs, RequestName)
	}
	ex := reqs[0].Exactly
	if ex.DeviceClassName != o.driverName || ex.AllocationMode != resourceapi.DeviceAllocationModeExactCount || ex.Count != int64(req.Count) {
		t.Errorf("request %+v, want class %s, ExactCount %d", ex, o.driverName, req.Count)
	}
}

func TestTemplateNames(t *testing.T) {
	o, _ := newOptions(nil)
	name := func(o options, r Request) string {
		t.Helper()
		tmpl, err := o.template("ns", r)
		if err != nil {
			t.Fatal(err)
		}
		return tmpl.Name
	}
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	base := name(o, Request{Count: 2, Model: "X", Memory: q("40Gi")})
	if got := name(o, Request{Count: 2, Model: "X", Memory: q("40960Mi")}); got != base {
		t.Errorf("40960Mi and 40Gi are the same request but got names %s and %s", got, base)
	}
	other, _ := newOptions([]Option{WithDriverName("gpu.acme.io")})
	for what, n := range map[string]string{
		"count":  name(o, Request{Count: 3, Model: "X", Memory: q("40Gi")}),
		"model":  name(o, Request{Count: 2, Model: "Y", Memory: q("40Gi")}),
		"memory": name(o, Request{Count: 2, Model: "X", Memory: q("41Gi")}),
		"none":   name(o, Request{Count: 2}),
		"driver": name(other, Request{Count: 2, Model: "X", Memory: q("40Gi")}),
		"share":  name(o, Request{Count: 2, Model: "X", Memory: q("40Gi"), MemoryShare: true}),
	} {
		if n == base {
			t.Errorf("a different %s must give a different template, both are %s", what, n)
		}
	}
}

// TestTemplateCache: the handler's cached template is the one options.template builds, in the
// asked namespace, and what one caller does to its copy never reaches the next.
func TestTemplateCache(t *testing.T) {
	h, err := NewHandler(&fakeClient{})
	if err != nil {
		t.Fatal(err)
	}
	mem := resource.MustParse("40Gi")
	req := Request{Count: 2, Model: "LATEST-GPU-MODEL", Memory: &mem}
	want, err := h.opts.template("b", req)
	if err != nil {
		t.Fatal(err)
	}
	first, err := h.template("a", req)
	if err != nil {
		t.Fatal(err)
	}
	first.Labels["tampered"] = "yes"
	first.Spec.Spec.Devices.Requests[0].Exactly.Selectors[0].CEL.Expression = "true"
	second, err := h.template("b", req)
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(second, want) {
		t.Errorf("cached template:\n%+v\nwant\n%+v", second, want)
	}
	other, err := h.template("b", Request{Count: 2, Model: "LATEST-GPU-MODEL"})
	if err != nil {
		t.Fatal(err)
	}
	if other.Name == second.Name {
		t.Errorf("requests with and without memory share template %s", other.Name)
	}
}
