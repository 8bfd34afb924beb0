package inventory

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// nodeSlice is the slice the plugin publishes for a node of spec, with the metadata the API
// server adds.
func nodeSlice(t testing.TB, node string, spec nodegroups.GroupSpec) *resourceapi.ResourceSlice {
	t.Helper()
	devices, err := simulated.New(node, spec).Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu.example.com-abcde", UID: "uid-" + "node", ResourceVersion: "42", Generation: 1,
			Labels:          map[string]string{"example.com/rack": "r1"},
			Annotations:     map[string]string{"a": "b"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: "n"}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "plugin", FieldsV1: metav1.NewFieldsV1(`{"f:spec":{}}`)}}},
		Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.example.com", NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}, Devices: devices},
	}
}

func mapPointer(m any) uintptr { return reflect.ValueOf(m).Pointer() }

func TestTransformSlice(t *testing.T) {
	in := NewInterner()
	shared := nodegroups.GroupSpec{Sharing: &nodegroups.Sharing{Mode: nodegroups.SharedMemory}}
	for _, tc := range []struct {
		name string
		spec nodegroups.GroupSpec
	}{
		{"exclusive", nodegroups.GroupSpec{}},
		{"small-model", nodegroups.GroupSpec{Count: 2, Model: "SMALL", Memory: ptr.To(resource.MustParse("16Gi"))}},
		{"shared-memory", shared},
		{"partitioned", nodegroups.GroupSpec{Count: 2, Sharing: &nodegroups.Sharing{Mode: nodegroups.Partitioned, Partitions: 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := nodeSlice(t, "node-a", tc.spec), nodeSlice(t, "node-b", tc.spec)
			a.UID = "0b7a4d8e-1f0c-4f2e-8c1a-3b2c1d0e9f8a" // as the API server makes them
			before := a.DeepCopy()
			outA, err := in.TransformSlice(a)
			if err != nil {
				t.Fatal(err)
			}
			outB, _ := in.TransformSlice(b)
			ta, tb := outA.(*Slice), outB.(*Slice)
			if !apiequality.Semantic.DeepEqual(a, before) {
				t.Fatal("the transform changed its input")
			}
			if full := ta.Full(); !apiequality.Semantic.DeepEqual(full.Spec, a.Spec) {
				t.Fatalf("spec changed:\n%+v\nwant\n%+v", full.Spec, a.Spec)
			}
			if cp := ta.DeepCopyObject().(*Slice); !apiequality.Semantic.DeepEqual(cp.Full(), ta.Full()) || mapPointer(cp.Spec.Devices[0].Attributes) == mapPointer(ta.Spec.Devices[0].Attributes) {
				t.Error("DeepCopyObject: not an equal, independent copy")
			}
			for i, d := range a.Spec.Devices {
				if got := ta.Attributes(i); !apiequality.Semantic.DeepEqual(got, d.Attributes) {
					t.Errorf("device %d: attributes %v, want %v", i, got, d.Attributes)
				}
				for n, want := range d.Attributes {
					if got, ok := ta.Attribute(i, n); !ok || !apiequality.Semantic.DeepEqual(got, want) {
						t.Errorf("device %d: attribute %s = %v, %t; want %v", i, n, got, ok, want)
					}
				}
				seen := map[resourceapi.QualifiedName]bool{}
				ta.RangeAttributes(i, func(n resourceapi.QualifiedName, got resourceapi.DeviceAttribute) {
					if seen[n] || !apiequality.Semantic.DeepEqual(got, d.Attributes[n]) {
						t.Errorf("device %d: RangeAttributes gave %s = %v twice or wrong", i, n, got)
					}
					seen[n] = true
				})
				if len(seen) != len(d.Attributes) {
					t.Errorf("device %d: RangeAttributes gave %d attributes, want %d", i, len(seen), len(d.Attributes))
				}
			}
			// No uid: no check reads a slice's.
			wantMeta := metav1.ObjectMeta{Name: a.Name, ResourceVersion: "42", Generation: 1, Labels: a.Labels}
			if got := ta.Full().ObjectMeta; !apiequality.Semantic.DeepEqual(got, wantMeta) {
				t.Errorf("metadata %+v, want only %+v", got, wantMeta)
			}
			// The same shape on two nodes: one capacity map, and one attribute map, the uuids
			// kept apart.
			for i := range ta.Spec.Devices {
				if mapPointer(ta.Spec.Devices[i].Capacity) != mapPointer(tb.Spec.Devices[i].Capacity) {
					t.Errorf("device %d: capacity maps of node-a and node-b not shared", i)
				}
				if mapPointer(ta.Spec.Devices[i].Attributes) != mapPointer(tb.Spec.Devices[i].Attributes) {
					t.Errorf("device %d: attribute maps of node-a and node-b not shared", i)
				}
				ua, _ := ta.Attribute(i, "uuid")
				ub, _ := tb.Attribute(i, "uuid")
				if *ua.StringValue == *ub.StringValue {
					t.Errorf("device %d: both nodes have uuid %s", i, *ua.StringValue)
				}
			}
		})
	}
}

func TestTransformSliceSharesEqualAttributes(t *testing.T) {
	in := NewInterner()
	mk := func(node string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node}, Spec: resourceapi.ResourceSliceSpec{
			Driver: "d", NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node},
			Devices: []resourceapi.Device{
				{Name: "nic", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"speed": {IntValue: ptr.To(int64(400))}, "rdma": {BoolValue: ptr.To(true)}}},
				{Name: "plain"},
			}}}
	}
	a, _ := in.TransformSlice(mk("a"))
	b, _ := in.TransformSlice(mk("b"))
	da, db := a.(*Slice).Spec.Devices, b.(*Slice).Spec.Devices
	if mapPointer(da[0].Attributes) != mapPointer(db[0].Attributes) {
		t.Error("identical attribute maps not shared")
	}
	if da[1].Attributes != nil || da[1].Capacity != nil {
		t.Errorf("nil maps became %v, %v", da[1].Attributes, da[1].Capacity)
	}
	if *da[0].Attributes["speed"].IntValue != 400 || !*da[0].Attributes["rdma"].BoolValue {
		t.Errorf("values changed: %+v", da[0].Attributes)
	}
}

// TestTransformSharedTableBounded: past its budget the Interner shares no more new values
// instead of growing with the fleet, and every slice keeps its own values intact.
func TestTransformSharedTableBounded(t *testing.T) {
	const budget = 64 << 10
	in := NewInterner(WithByteBudget(budget))
	var kept []*Slice
	for i := range 4096 {
		s := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: []resourceapi.Device{{Name: "d",
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse(fmt.Sprintf("%dMi", i+1))}}}}}}
		out, _ := in.TransformSlice(s)
		kept = append(kept, out.(*Slice))
	}
	for i, s := range kept {
		if got := s.Spec.Devices[0].Capacity["memory"].Value; got.Cmp(resource.MustParse(fmt.Sprintf("%dMi", i+1))) != 0 {
			t.Fatalf("slice %d: memory %s", i, got.String())
		}
	}
	if entries, bytes := in.usage(); bytes > budget || entries >= 4096 {
		t.Errorf("%d entries of %d bytes, want at most %d bytes", entries, bytes, budget)
	}
}

func TestTransformPassesOtherObjects(t *testing.T) {
	tomb := cache.DeletedFinalStateUnknown{Key: "x"}
	for _, f := range []cache.TransformFunc{NewInterner().TransformSlice, TransformClass} {
		if out, err := f(tomb); err != nil || out != any(tomb) {
			t.Errorf("tombstone became %v, %v", out, err)
		}
	}
	c := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu", Annotations: map[string]string{"x": "y"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "helm"}}}, Spec: resourceapi.DeviceClassSpec{ExtendedResourceName: ptr.To("example.com/gpu")}}
	out, _ := TransformClass(c)
	got := out.(*resourceapi.DeviceClass)
	if got.Name != "gpu" || got.Annotations != nil || got.ManagedFields != nil || !apiequality.Semantic.DeepEqual(got.Spec, c.Spec) {
		t.Errorf("class transformed to %+v", got)
	}
}

// TestListSlicesInPages: the informer's list reads pages at the latest resourceVersion, passes
// each continue token on, and returns every item transformed.
func TestListSlicesInPages(t *testing.T) {
	var calls []metav1.ListOptions
	pages := 3
	list := func(_ context.Context, o metav1.ListOptions) (*resourceapi.ResourceSliceList, error) {
		calls = append(calls, o)
		n := len(calls)
		page := &resourceapi.ResourceSliceList{ListMeta: metav1.ListMeta{ResourceVersion: "7"}}
		for i := range 2 {
			page.Items = append(page.Items, *nodeSlice(t, fmt.Sprintf("n%d-%d", n, i), nodegroups.GroupSpec{}))
		}
		if n < pages {
			page.Continue = fmt.Sprintf("token-%d", n)
		}
		return page, nil
	}
	out, err := NewInterner().listSlices(context.Background(), metav1.ListOptions{ResourceVersion: "0", ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, FieldSelector: "x=y"}, list)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != pages || len(out.Items) != 2*pages || out.Continue != "" || out.ResourceVersion != "7" {
		t.Fatalf("%d calls, %d items, continue %q, rv %q", len(calls), len(out.Items), out.Continue, out.ResourceVersion)
	}
	for i, o := range calls {
		wantContinue := ""
		if i > 0 {
			wantContinue = fmt.Sprintf("token-%d", i)
		}
		if o.ResourceVersion != "" || o.ResourceVersionMatch != "" || o.Limit != listPageSize || o.Continue != wantContinue || o.FieldSelector != "x=y" {
			t.Errorf("call %d: options %+v", i, o)
		}
	}
	for _, s := range out.Items {
		if m := s.Full().ObjectMeta; m.ManagedFields != nil || m.OwnerReferences != nil || len(s.Spec.Devices) != 8 {
			t.Errorf("item %s not transformed: %+v", s.Name, m)
		}
	}
	failing := func(context.Context, metav1.ListOptions) (*resourceapi.ResourceSliceList, error) {
		return nil, fmt.Errorf("boom")
	}
	if _, err := NewInterner().listSlices(context.Background(), metav1.ListOptions{}, failing); err == nil {
		t.Error("list error lost")
	}
}

// TestTransformEvent: watch events carry transformed slices, bookmarks too (the informer
// expects one type); errors pass as sent.
func TestTransformEvent(t *testing.T) {
	in := NewInterner()
	for _, typ := range []watch.EventType{watch.Added, watch.Modified, watch.Deleted} {
		e, ok := in.transformEvent(watch.Event{Type: typ, Object: nodeSlice(t, "n", nodegroups.GroupSpec{})})
		if !ok || e.Type != typ || e.Object.(*Slice).Full().ManagedFields != nil {
			t.Errorf("%s: %v, %+v", typ, ok, e)
		}
	}
	bookmark := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "9"}}
	if e, ok := in.transformEvent(watch.Event{Type: watch.Bookmark, Object: bookmark}); !ok || e.Object.(*Slice).ResourceVersion() != "9" {
		t.Errorf("bookmark: %+v", e)
	}
	status := &metav1.Status{Message: "too old"}
	if e, ok := in.transformEvent(watch.Event{Type: watch.Error, Object: status}); !ok || e.Object != runtime.Object(status) {
		t.Errorf("error event changed: %+v", e)
	}
}

// TestTransformSliceOwnAttributes: string and version attributes that differ between devices are
// kept apart and read back whole; one too long to keep apart stays in the device's map.
func TestTransformSliceOwnAttributes(t *testing.T) {
	long := strings.Repeat("x", math.MaxUint16+1)
	dev := func(i int) resourceapi.Device {
		uuid := fmt.Sprintf("6f5d8c6e-1f0c-7f2e-5c1a-3b2c1d0e9f8%d", i)
		return resourceapi.Device{Name: fmt.Sprintf("gpu-%d", i), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"uuid":     {StringValue: ptr.To(fmt.Sprintf("GPU-%d", i))},
			"firmware": {VersionValue: ptr.To(fmt.Sprintf("1.%d.0", i))},
			"blob":     {StringValue: ptr.To(long + fmt.Sprint(i))},
			"model":    {StringValue: ptr.To("M")},
			// UUIDs are kept packed; what is not quite one (upper case, a digit too many or
			// a letter past f) is kept as it is, and every one reads back as published.
			"gpuUUID": {StringValue: ptr.To("GPU-" + uuid)},
			"bare":    {StringValue: ptr.To(uuid)},
			"upper":   {StringValue: ptr.To(strings.ToUpper(uuid))},
			"longer":  {StringValue: ptr.To(uuid + "0")},
			"notHex":  {StringValue: ptr.To(strings.Replace(uuid, "f", "g", 1))},
			"dashes":  {VersionValue: ptr.To(strings.ReplaceAll(uuid, "-", "0"))},
		}}
	}
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: "d", NodeName: ptr.To("n"), Pool: resourceapi.ResourcePool{Name: "n"}, Devices: []resourceapi.Device{dev(0), dev(1), dev(2)}}}
	out, err := NewInterner().TransformSlice(s)
	if err != nil {
		t.Fatal(err)
	}
	kept := out.(*Slice)
	if full := kept.Full(); !apiequality.Semantic.DeepEqual(full.Spec, s.Spec) {
		t.Fatal("Full() is not the slice as published")
	}
	if kept.ownText().count() != 3*8 {
		t.Errorf("%d attributes kept apart, want all but blob and model of 3 devices", kept.ownText().count())
	}
	for i := range s.Spec.Devices {
		if _, ok := kept.Spec.Devices[i].Attributes["blob"]; !ok {
			t.Errorf("device %d: the long attribute left its map", i)
		}
		if a, ok := kept.Attribute(i, "firmware"); !ok || a.VersionValue == nil || *a.VersionValue != fmt.Sprintf("1.%d.0", i) {
			t.Errorf("device %d: firmware %+v", i, a)
		}
	}
}

// TestTransformSliceDropsCostlyQuantities: a string attribute that a selector's quantity() would
// parse for minutes is not kept, whether devices share it or each has its own; every other
// attribute is, and an honest device's map is not copied.
func TestTransformSliceDropsCostlyQuantities(t *testing.T) {
	in := NewInterner()
	s := nodeSlice(t, "node-a", nodegroups.GroupSpec{Count: 2})
	honest := s.DeepCopy()
	s.Spec.Devices[0].Attributes["shared"] = resourceapi.DeviceAttribute{StringValue: ptr.To("1e-99999999")}
	s.Spec.Devices[1].Attributes["shared"] = resourceapi.DeviceAttribute{StringValue: ptr.To("1e-99999999")}
	s.Spec.Devices[0].Attributes["own"] = resourceapi.DeviceAttribute{StringValue: ptr.To("1E5000000")}
	s.Spec.Devices[1].Attributes["own"] = resourceapi.DeviceAttribute{StringValue: ptr.To("5e-5000000")}
	s.Spec.Devices[1].Attributes["cheap"] = resourceapi.DeviceAttribute{StringValue: ptr.To("E5000")}
	before := s.DeepCopy()
	out, err := in.TransformSlice(s)
	if err != nil {
		t.Fatal(err)
	}
	if !apiequality.Semantic.DeepEqual(s, before) {
		t.Error("TransformSlice changed its input")
	}
	got := out.(*Slice)
	for i := range got.Spec.Devices {
		attrs := got.Attributes(i)
		for _, name := range []resourceapi.QualifiedName{"shared", "own"} {
			if a, ok := attrs[name]; ok {
				t.Errorf("device %d keeps %s = %q, a quantity no parse of which is bounded", i, name, ptr.Deref(a.StringValue, ""))
			}
			if _, ok := got.Attribute(i, name); ok {
				t.Errorf("device %d: Attribute finds %s", i, name)
			}
		}
		for name, a := range honest.Spec.Devices[i].Attributes {
			if !apiequality.Semantic.DeepEqual(attrs[name], a) {
				t.Errorf("device %d: %s = %+v, want %+v as published", i, name, attrs[name], a)
			}
		}
	}
	if a := got.Attributes(1)["cheap"]; ptr.Deref(a.StringValue, "") != "E5000" {
		t.Errorf("device 1: cheap = %+v, want E5000 as published (zero times a power of ten parses at once)", a)
	}
	attrs := honest.Spec.Devices[0].Attributes
	if kept := withoutCostlyQuantities(attrs); mapPointer(kept) != mapPointer(attrs) {
		t.Error("an honest device's attributes were copied")
	}
}

// TestWrap: a wrapped slice reads as the slice as published, attribute by attribute and as a whole,
// but for the attributes a selector's quantity() would parse for minutes, which TransformSlice
// drops too; it leaves the published slice alone and shares its devices while none is dropped.
func TestWrap(t *testing.T) {
	honest := nodeSlice(t, "node-a", nodegroups.GroupSpec{Count: 2})
	costly := honest.DeepCopy()
	costly.Spec.Devices[1].Attributes["own"] = resourceapi.DeviceAttribute{StringValue: ptr.To("5e-5000000")}
	before := costly.DeepCopy()
	got := Wrap([]*resourceapi.ResourceSlice{honest, costly})
	if len(got) != 2 {
		t.Fatalf("%d slices, want 2", len(got))
	}
	if !apiequality.Semantic.DeepEqual(costly, before) {
		t.Error("Wrap changed its input")
	}
	if &got[0].Spec.Devices[0] != &honest.Spec.Devices[0] {
		t.Error("an honest slice's devices were copied")
	}
	for k, w := range got {
		if w.Name != honest.Name || !apiequality.Semantic.DeepEqual(w.Full().Spec, honest.Spec) {
			t.Errorf("slice %d: Full() is not the slice as published, less the costly attribute", k)
		}
		for i := range w.Spec.Devices {
			for name, a := range honest.Spec.Devices[i].Attributes {
				if got, ok := w.Attribute(i, name); !ok || !apiequality.Semantic.DeepEqual(got, a) {
					t.Errorf("slice %d device %d: %s = %+v, want %+v", k, i, name, got, a)
				}
			}
			if _, ok := w.Attribute(i, "own"); ok {
				t.Errorf("slice %d device %d keeps the costly attribute", k, i)
			}
		}
	}
}
