package inventory

import (
	"context"
	"encoding/json"
	"maps"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
)

// The informers keep what the checks read and share what repeats. A fleet is thousands of nodes
// publishing the same few device shapes: without this, 5,000 nodes × 8 GPUs hold 40,000 copies of
// the same capacity map, 40,000 copies of each attribute name and model string, and each slice its
// managedFields (a field set per device). The cached objects are read-only (as every informer
// cache is), so equal parts can be one value.

// sliceMeta (in.mu held) keeps of a slice's metadata what identifies it; the allocator and the
// View read only the spec and the name.
func (in *Interner) sliceMeta(m *metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion, Generation: m.Generation, Labels: in.labels(m.Labels)}
}

// TransformSlice is the ResourceSlice informer's transform: a *Slice with metadata stripped to
// sliceMeta, interned strings, shared capacity maps, and shared attribute maps with the attributes
// a device has on its own kept apart. It leaves obj alone. Anything but a *ResourceSlice passes
// through (tombstones).
func (in *Interner) TransformSlice(obj any) (any, error) {
	s, ok := obj.(*resourceapi.ResourceSlice)
	if !ok {
		return obj, nil
	}
	return in.compact(s), nil
}

func (in *Interner) compact(s *resourceapi.ResourceSlice) *Slice {
	out := &Slice{TypeMeta: s.TypeMeta, Spec: s.Spec}
	varying := varyingStrings(s.Spec.Devices)
	in.mu.Lock()
	defer in.mu.Unlock()
	out.ObjectMeta = in.sliceMeta(&s.ObjectMeta)
	out.Spec.Driver = *in.str(s.Spec.Driver)
	if s.Spec.Devices == nil {
		return out
	}
	out.Spec.Devices = make([]resourceapi.Device, len(s.Spec.Devices))
	var text []byte
	for i := range s.Spec.Devices {
		d := s.Spec.Devices[i]
		d.Name = *in.str(d.Name)
		d.Attributes = withoutCostlyQuantities(d.Attributes)
		attrs, cloned := d.Attributes, false
		for n, a := range d.Attributes {
			if !varying[n] || (a.StringValue == nil && a.VersionValue == nil) {
				continue
			}
			value := ptr.Deref(a.StringValue, ptr.Deref(a.VersionValue, ""))
			if !fitsOwn(string(n), value) {
				continue
			}
			if !cloned {
				attrs, cloned = maps.Clone(d.Attributes), true
			}
			delete(attrs, n)
			out.own, text = addOwn(out.own, text, i, string(n), value, a.VersionValue != nil)
		}
		if cloned && len(attrs) == 0 {
			attrs = nil
		}
		d.Attributes = in.attributes(attrs)
		d.Capacity = in.capacity(d.Capacity)
		out.Spec.Devices[i] = d
	}
	out.Spec.Devices = in.devices(out.Spec.Devices)
	out.ownText = string(text)
	return out
}

// devices (in.mu held) returns a list equal to devices, shared with every slice of the same
// devices: with their own attributes apart, the nodes of one node group publish the same list.
func (in *Interner) devices(devices []resourceapi.Device) []resourceapi.Device {
	return shared(in.deviceLists, devices, func() []resourceapi.Device { return devices })
}

// varyingStrings are the names of the string and version attributes that differ between the
// devices of a slice: a device's own (a uuid, a serial number), which would make each device's map
// unique. The values of other attributes repeat (a model, an index on every node).
func varyingStrings(devices []resourceapi.Device) map[resourceapi.QualifiedName]bool {
	first := map[resourceapi.QualifiedName]string{}
	var out map[resourceapi.QualifiedName]bool
	for i := range devices {
		for n, a := range devices[i].Attributes {
			var v string
			switch {
			case a.StringValue != nil:
				v = "s" + *a.StringValue
			case a.VersionValue != nil:
				v = "v" + *a.VersionValue
			default:
				continue
			}
			if f, ok := first[n]; !ok {
				first[n] = v
			} else if f != v {
				if out == nil {
					out = map[resourceapi.QualifiedName]bool{}
				}
				out[n] = true
			}
		}
	}
	return out
}

// listPageSize is the page of the slice informer's lists: a page is decoded whole before it is
// transformed, 2 MB at 100 slices of 8 GPUs.
const listPageSize = 100

// listSlices is the slice informer's list: in pages (ListInPages), each transformed as it arrives.
// At 5,000 nodes a single list would be the webhook's peak memory at a restart, twice what it keeps.
func (in *Interner) listSlices(ctx context.Context, o metav1.ListOptions, list func(context.Context, metav1.ListOptions) (*resourceapi.ResourceSliceList, error)) (*SliceList, error) {
	out := &SliceList{}
	err := ListInPages(ctx, o, listPageSize, list, func(page *resourceapi.ResourceSliceList) {
		for i := range page.Items {
			out.Items = append(out.Items, *in.compact(&page.Items[i]))
		}
		out.TypeMeta, out.ResourceVersion = page.TypeMeta, page.ResourceVersion
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// transformEvent transforms the slice of a watch event (a bookmark's too: the informer expects
// one type); errors pass unchanged.
func (in *Interner) transformEvent(e watch.Event) (watch.Event, bool) {
	switch e.Type {
	case watch.Added, watch.Modified, watch.Deleted, watch.Bookmark:
		if obj, err := in.TransformSlice(e.Object); err == nil {
			e.Object = obj.(runtime.Object)
		}
	}
	return e, true
}

// TransformClass is the DeviceClass informer's transform: no managedFields, annotations or owners.
func TransformClass(obj any) (any, error) {
	c, ok := obj.(*resourceapi.DeviceClass)
	if !ok {
		return obj, nil
	}
	out := &resourceapi.DeviceClass{TypeMeta: c.TypeMeta, Spec: c.Spec,
		ObjectMeta: metav1.ObjectMeta{Name: c.Name, UID: c.UID, ResourceVersion: c.ResourceVersion, Generation: c.Generation, Labels: c.Labels}}
	return out, nil
}

// maxShared bounds each table of shared maps. Past it the table starts over: objects keep what
// they share, later ones share anew. Only a driver publishing more distinct shapes than this
// (every device different) fills it, and then sharing would not pay anyway.
const maxShared = 4096

// Interner shares equal strings, attribute values, attribute maps, capacity maps, device lists,
// label maps and label key lists between the objects the informers cache. Safe for concurrent use; the zero value is not usable,
// use NewInterner.
type Interner struct {
	mu sync.Mutex
	// strs holds one copy of each string seen (names, models, versions, label values), and the
	// pointer attribute values share.
	strs     map[string]*string
	attrMaps map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	capMaps  map[string]map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
	// deviceLists are slices' device lists, their own attributes apart.
	deviceLists map[string][]resourceapi.Device
	labelMaps   map[string]map[string]string
	keyLists    map[string][]string
}

// NewInterner returns an empty Interner.
func NewInterner() *Interner {
	return &Interner{
		strs:     map[string]*string{},
		attrMaps: map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{},
		capMaps:  map[string]map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{},

		deviceLists: map[string][]resourceapi.Device{},
		labelMaps:   map[string]map[string]string{},
		keyLists:    map[string][]string{},
	}
}

// str returns the shared copy of s; in.mu must be held. Strings that never repeat (uuids, node
// names) pass through the table too: telling them apart would cost more than the table, which
// starts over at maxShared entries.
func (in *Interner) str(s string) *string {
	if p, ok := in.strs[s]; ok {
		return p
	}
	if len(in.strs) >= maxShared {
		clear(in.strs)
	}
	p := &s
	in.strs[s] = p
	return p
}

// smallInts are shared pointers for the integer attributes that repeat everywhere (indexes,
// counts); others get their own.
var smallInts = func() (out [256]int64) {
	for i := range out {
		out[i] = int64(i)
	}
	return out
}()

var boolValues = [2]bool{false, true}

func (in *Interner) attribute(a resourceapi.DeviceAttribute) resourceapi.DeviceAttribute {
	switch {
	case a.IntValue != nil:
		if v := *a.IntValue; v >= 0 && v < int64(len(smallInts)) {
			return resourceapi.DeviceAttribute{IntValue: &smallInts[v]}
		}
	case a.BoolValue != nil:
		if *a.BoolValue {
			return resourceapi.DeviceAttribute{BoolValue: &boolValues[1]}
		}
		return resourceapi.DeviceAttribute{BoolValue: &boolValues[0]}
	case a.StringValue != nil:
		return resourceapi.DeviceAttribute{StringValue: in.str(*a.StringValue)}
	case a.VersionValue != nil:
		return resourceapi.DeviceAttribute{VersionValue: in.str(*a.VersionValue)}
	}
	return a
}

// attributes (in.mu held) returns a map equal to attrs: an identical one seen before, or a copy
// with interned names and values.
func (in *Interner) attributes(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	if attrs == nil {
		return nil
	}
	return shared(in.attrMaps, attrs, func() map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
		m := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(attrs))
		for n, a := range attrs {
			m[resourceapi.QualifiedName(*in.str(string(n)))] = in.attribute(a)
		}
		return m
	})
}

// capacity (in.mu held) returns a map equal to caps, shared with every device of the same capacities.
func (in *Interner) capacity(caps map[resourceapi.QualifiedName]resourceapi.DeviceCapacity) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	if caps == nil {
		return nil
	}
	return shared(in.capMaps, caps, func() map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
		m := make(map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, len(caps))
		for n, c := range caps {
			m[resourceapi.QualifiedName(*in.str(string(n)))] = c
		}
		return m
	})
}

// shared returns the value table holds for v's shapeKey, or stores and returns build() (equal to
// v) for it. The table starts over at maxShared entries. A v that cannot be encoded is returned
// as it is.
func shared[T any](table map[string]T, v T, build func() T) T {
	key, ok := shapeKey(v)
	if !ok {
		return v
	}
	if s, ok := table[key]; ok {
		return s
	}
	s := build()
	if len(table) >= maxShared {
		clear(table)
	}
	table[key] = s
	return s
}

// shapeKey encodes a map canonically (JSON sorts map keys): equal keys are equal maps. Different
// spellings of one quantity ("1Gi", "1024Mi") get different keys and are merely not shared.
func shapeKey(m any) (string, bool) {
	data, err := json.Marshal(m)
	return string(data), err == nil
}

// labels (in.mu held) returns a map equal to labels, shared with every object of the same labels.
func (in *Interner) labels(labels map[string]string) map[string]string {
	if labels == nil {
		return nil
	}
	return shared(in.labelMaps, labels, func() map[string]string {
		out := make(map[string]string, len(labels))
		for k, v := range labels {
			out[*in.str(k)] = *in.str(v)
		}
		return out
	})
}

// keys (in.mu held) returns a list equal to keys, shared with every object of the same.
func (in *Interner) keys(keys []string) []string {
	return shared(in.keyLists, keys, func() []string {
		for i, k := range keys {
			keys[i] = *in.str(k)
		}
		return keys
	})
}
