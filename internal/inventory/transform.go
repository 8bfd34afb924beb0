package inventory

import (
	"context"
	"maps"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/listing"
)

// The informers keep what the checks read and share what repeats. A fleet is thousands of nodes
// publishing the same few device shapes: without this, 5,000 nodes × 8 GPUs hold 40,000 copies of
// the same capacity map, 40,000 copies of each attribute name and model string, and each slice its
// managedFields (a field set per device). The cached objects are read-only (as every informer
// cache is), so equal parts can be one value.

// TransformSlice is the ResourceSlice informer's transform: a *Slice with metadata stripped to
// Meta and labels, interned strings, shared capacity maps, and shared attribute maps with the attributes
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
	out := &Slice{Spec: NewSliceSpec(&s.Spec)}
	var held []*entry
	// The list's key is read before the lock: a slice of a shape seen before (every node of a
	// group) takes its list without looking at its devices one by one.
	var key string
	var keyed bool
	var own ownBuilder
	if s.Spec.Devices != nil {
		out.Spec.Devices = ownApart(s.Spec.Devices, &own)
		key, keyed = shapeKey(out.Spec.Devices)
	}
	// Of the metadata, the name and versions: the allocator and the View read only the spec and
	// the name, and no check reads the uid (17 bytes a slice).
	out.Meta = newMeta(s.Name, "", s.ResourceVersion, s.Generation, own.encoded())
	oneString(&out.Name, &out.ids, &out.Spec.Pool.Name, &out.Spec.NodeName)
	in.mu.Lock()
	labels := in.labels(s.Labels, &held)
	out.Spec.Driver = *in.str(s.Spec.Driver, &held)
	if out.Spec.Devices != nil {
		out.Spec.Devices = in.devices(out.Spec.Devices, key, keyed, &held)
	}
	out.held = in.hold(held, labels)
	in.mu.Unlock()
	return out
}

// Wrap returns slices as the checks read them, without sharing anything: each a *Slice holding
// the published spec (no attributes kept apart), less the attributes that a selector's quantity()
// would parse at an unbounded cost (as TransformSlice drops them). For an inventory read once, as
// kubectl dra reads a cluster's: its slices are held anyway, and finding what repeats (an encoding
// and a digest of every device list and attribute map) cost it more time than all its checks.
func Wrap(published []*resourceapi.ResourceSlice) []*Slice {
	out := make([]*Slice, len(published))
	for i, s := range published {
		w := &Slice{Meta: metaOf(&s.ObjectMeta), Spec: NewSliceSpec(&s.Spec)}
		w.withLabels(s.Labels)
		for j := range s.Spec.Devices {
			attrs := s.Spec.Devices[j].Attributes
			kept := withoutCostlyQuantities(attrs)
			if len(kept) == len(attrs) {
				continue
			}
			if &w.Spec.Devices[0] == &s.Spec.Devices[0] {
				w.Spec.Devices = slices.Clone(s.Spec.Devices)
			}
			w.Spec.Devices[j].Attributes = kept
		}
		out[i] = w
	}
	return out
}

// ownApart returns a copy of devices with the attributes that cost more than they say removed
// and the string and version attributes that vary between devices moved to own.
func ownApart(devices []resourceapi.Device, own *ownBuilder) []resourceapi.Device {
	varying := varyingStrings(devices)
	out := make([]resourceapi.Device, len(devices))
	for i := range devices {
		d := devices[i]
		d.Attributes = withoutCostlyQuantities(d.Attributes)
		attrs, cloned := d.Attributes, false
		for n, a := range d.Attributes {
			if !varying[n] || (a.StringValue == nil && a.VersionValue == nil) {
				continue
			}
			value := ptr.Deref(a.StringValue, ptr.Deref(a.VersionValue, ""))
			if !own.add(i, string(n), value, a.VersionValue != nil) {
				continue
			}
			if !cloned {
				attrs, cloned = maps.Clone(d.Attributes), true
			}
			delete(attrs, n)
		}
		if cloned && len(attrs) == 0 {
			attrs = nil
		}
		d.Attributes = attrs
		out[i] = d
	}
	return out
}

// devices (in.mu held) returns a list equal to devices (their own attributes apart), shared with
// every slice of the same devices under key: the nodes of one node group publish the same list.
// A list that is not shared (the budget is full) still shares its devices' parts.
func (in *Interner) devices(devices []resourceapi.Device, key string, keyed bool, held *[]*entry) []resourceapi.Device {
	if keyed {
		if v, ok := take(in.deviceLists, key, held); ok {
			return v.([]resourceapi.Device)
		}
	}
	var parts []*entry
	for i := range devices {
		d := &devices[i]
		d.Name = *in.str(d.Name, &parts)
		d.Attributes = in.attributes(d.Attributes, &parts)
		d.Capacity = in.capacity(d.Capacity, &parts)
	}
	if size := entrySize(key, len(devices)*deviceSize); keyed && in.fits(size) {
		in.add(in.deviceLists, key, size, devices, parts, held)
	} else {
		*held = append(*held, parts...)
	}
	return devices
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

// listSlices is the slice informer's list: in pages (listing.InPages), each transformed as it arrives.
// At 5,000 nodes a single list would be the webhook's peak memory at a restart, twice what it keeps.
func (in *Interner) listSlices(ctx context.Context, o metav1.ListOptions, list func(context.Context, metav1.ListOptions) (*resourceapi.ResourceSliceList, error)) (*SliceList, error) {
	out := &SliceList{}
	err := listing.InPages(ctx, o, listPageSize, list, func(page *resourceapi.ResourceSliceList) {
		for i := range page.Items {
			out.Items = append(out.Items, in.compact(&page.Items[i]))
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
