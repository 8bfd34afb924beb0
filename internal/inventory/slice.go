package inventory

import (
	"maps"
	"math"
	"sort"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Slice is a ResourceSlice as the informers keep it. Devices of one shape repeat across a fleet
// but for an attribute or two of their own (a uuid each), and a Go map of 8 attributes is over a
// kilobyte: a map per device would be most of the webhook's memory. So Spec is the published spec
// except that each device's Attributes hold only what it can share with other devices, and the
// string and version attributes that vary between the devices of the slice are in own. Full and
// Attributes put them back together; Attribute reads one without doing so.
type Slice struct {
	metav1.TypeMeta
	Meta
	Labels map[string]string
	Spec   resourceapi.ResourceSliceSpec
	// own is sorted by device index; the names and values are in ownText. Neither holds a
	// pointer: the collector, which walks every cached slice on every cycle, skips both.
	own     []ownAttribute
	ownText string
	// held keeps the Interner's entries this slice shares for as long as the slice lives.
	held *holding
}

// ownAttribute is a string or version attribute of one device, kept apart from its shared map:
// its name and then its value, at off in the slice's ownText.
type ownAttribute struct {
	device            int32
	off               uint32
	nameLen, valueLen uint16
	version           bool
}

// fitsOwn: an attribute of this name and value can be an ownAttribute. The API server allows far
// shorter ones; anything else stays in the device's map.
func fitsOwn(name, value string) bool {
	return len(name) <= math.MaxUint16 && len(value) <= math.MaxUint16
}

// addOwn appends attribute name of device i to own and its text to text.
func addOwn(own []ownAttribute, text []byte, i int, name, value string, version bool) ([]ownAttribute, []byte) {
	own = append(own, ownAttribute{device: int32(i), off: uint32(len(text)), nameLen: uint16(len(name)), valueLen: uint16(len(value)), version: version})
	return own, append(append(text, name...), value...)
}

func (s *Slice) ownName(a *ownAttribute) string {
	return s.ownText[a.off : a.off+uint32(a.nameLen)]
}

// ownOf returns the own attributes of device i.
func (s *Slice) ownOf(i int) []ownAttribute {
	lo := sort.Search(len(s.own), func(k int) bool { return int(s.own[k].device) >= i })
	hi := lo
	for hi < len(s.own) && int(s.own[hi].device) == i {
		hi++
	}
	return s.own[lo:hi]
}

func (s *Slice) ownAttribute(a *ownAttribute) resourceapi.DeviceAttribute {
	start := a.off + uint32(a.nameLen)
	v := s.ownText[start : start+uint32(a.valueLen)]
	if a.version {
		return resourceapi.DeviceAttribute{VersionValue: &v}
	}
	return resourceapi.DeviceAttribute{StringValue: &v}
}

// Attribute returns attribute name of device i.
func (s *Slice) Attribute(i int, name resourceapi.QualifiedName) (resourceapi.DeviceAttribute, bool) {
	own := s.ownOf(i)
	for k := range own {
		if s.ownName(&own[k]) == string(name) {
			return s.ownAttribute(&own[k]), true
		}
	}
	a, ok := s.Spec.Devices[i].Attributes[name]
	return a, ok
}

// Attributes returns every attribute of device i: the shared map itself when the device has none
// of its own, else a new map. Callers must not modify it.
func (s *Slice) Attributes(i int) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	own := s.ownOf(i)
	shared := s.Spec.Devices[i].Attributes
	if len(own) == 0 {
		return shared
	}
	out := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(shared)+len(own))
	maps.Copy(out, shared)
	for k := range own {
		out[resourceapi.QualifiedName(s.ownName(&own[k]))] = s.ownAttribute(&own[k])
	}
	return out
}

// RangeAttributes calls f with the name and value of every attribute of device i.
func (s *Slice) RangeAttributes(i int, f func(resourceapi.QualifiedName, resourceapi.DeviceAttribute)) {
	for n, a := range s.Spec.Devices[i].Attributes {
		f(n, a)
	}
	own := s.ownOf(i)
	for k := range own {
		f(resourceapi.QualifiedName(s.ownName(&own[k])), s.ownAttribute(&own[k]))
	}
}

// Full returns the slice as published (without the metadata the transform dropped). It allocates
// an attribute map per device that has attributes of its own: use it for a few slices at a time.
func (s *Slice) Full() *resourceapi.ResourceSlice {
	out := &resourceapi.ResourceSlice{TypeMeta: s.TypeMeta, ObjectMeta: s.objectMeta(s.Labels), Spec: s.Spec}
	if len(s.own) == 0 {
		return out
	}
	out.Spec.Devices = make([]resourceapi.Device, len(s.Spec.Devices))
	for i := range s.Spec.Devices {
		out.Spec.Devices[i] = s.Spec.Devices[i]
		out.Spec.Devices[i].Attributes = s.Attributes(i)
	}
	return out
}

// DeepCopyObject makes Slice a runtime.Object, as the informer's store wants; the copy shares
// nothing with s.
func (s *Slice) DeepCopyObject() runtime.Object {
	out := &Slice{TypeMeta: s.TypeMeta, Meta: s.Meta, Labels: maps.Clone(s.Labels), own: append([]ownAttribute(nil), s.own...), ownText: s.ownText}
	s.Spec.DeepCopyInto(&out.Spec)
	return out
}

// GetObjectMeta is what the informer's key function and reflector read of the slice.
func (s *Slice) GetObjectMeta() metav1.Object {
	m := s.objectMeta(s.Labels)
	return &m
}

// SliceList is a list of Slices, as the slice informer's list returns them.
type SliceList = CompactList[Slice, *Slice]

// CompactList is a page of the compact objects an informer keeps (a transformed list): client-go's
// reflector reads its Items and ResourceVersion like any list's.
type CompactList[T any, PT interface {
	*T
	runtime.Object
}] struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []T
}

// DeepCopyObject makes CompactList a runtime.Object; the copy shares nothing with l.
func (l *CompactList[T, PT]) DeepCopyObject() runtime.Object {
	out := &CompactList[T, PT]{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	out.Items = make([]T, len(l.Items))
	for i := range l.Items {
		out.Items[i] = *PT(&l.Items[i]).DeepCopyObject().(PT)
	}
	return out
}

// Compact returns slices as the informers keep them, sharing what repeats through in.
func Compact(in *Interner, slices []*resourceapi.ResourceSlice) []*Slice {
	out := make([]*Slice, len(slices))
	for i, s := range slices {
		out[i] = in.compact(s)
	}
	return out
}
