package inventory

import (
	"maps"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Slice is a ResourceSlice as the informers keep it. Devices of one shape repeat across a fleet
// but for an attribute or two of their own (a uuid each), and a Go map of 8 attributes is over a
// kilobyte: a map per device would be most of the webhook's memory. So Spec is what a SliceSpec
// keeps of the published spec, each device's Attributes holding only what it can share with other
// devices, and the string and version attributes that vary between the devices of the slice are
// in own. Full and Attributes put them back together; Attribute reads one without doing so.
type Slice struct {
	// Meta holds the own attributes (ownText, after the resourceVersion). The slice's
	// strings of its own (those, its name, its pool's and node's names) are one allocation a
	// slice, which holds no pointer, so the collector, which walks every cached slice on every
	// cycle, skips it.
	Meta
	Spec SliceSpec
	// held keeps the Interner's entries this slice shares for as long as the slice lives.
	held *holding
}

// Attribute returns attribute name of device i.
func (s *Slice) Attribute(i int, name resourceapi.QualifiedName) (resourceapi.DeviceAttribute, bool) {
	own := s.ownText()
	lo, hi := own.of(i)
	for k := lo; k < hi; k++ {
		if a := own.at(k); own.name(&a) == string(name) {
			return own.attribute(&a), true
		}
	}
	a, ok := s.Spec.Devices[i].Attributes[name]
	return a, ok
}

// Attributes returns every attribute of device i: the shared map itself when the device has none
// of its own, else a new map. Callers must not modify it.
func (s *Slice) Attributes(i int) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	own := s.ownText()
	lo, hi := own.of(i)
	shared := s.Spec.Devices[i].Attributes
	if lo == hi {
		return shared
	}
	out := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(shared)+hi-lo)
	maps.Copy(out, shared)
	for k := lo; k < hi; k++ {
		a := own.at(k)
		out[resourceapi.QualifiedName(own.name(&a))] = own.attribute(&a)
	}
	return out
}

// RangeAttributes calls f with the name and value of every attribute of device i.
func (s *Slice) RangeAttributes(i int, f func(resourceapi.QualifiedName, resourceapi.DeviceAttribute)) {
	for n, a := range s.Spec.Devices[i].Attributes {
		f(n, a)
	}
	own := s.ownText()
	lo, hi := own.of(i)
	for k := lo; k < hi; k++ {
		a := own.at(k)
		f(resourceapi.QualifiedName(own.name(&a)), own.attribute(&a))
	}
}

// Full returns the slice as published (without the metadata the transform dropped). It allocates
// an attribute map per device that has attributes of its own: use it for a few slices at a time.
func (s *Slice) Full() *resourceapi.ResourceSlice {
	out := &resourceapi.ResourceSlice{ObjectMeta: s.objectMeta(s.Labels()), Spec: s.Spec.Published()}
	if s.ownText().count() == 0 {
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
	out := &Slice{Meta: s.Meta}
	if labels := s.Labels(); labels != nil {
		out.held = &holding{labels: maps.Clone(labels)}
	}
	spec := s.Spec.Published()
	out.Spec = NewSliceSpec(spec.DeepCopy())
	return out
}

// ownText is the slice's own attributes.
func (s *Slice) ownText() ownText {
	_, _, _, rest := s.fields()
	return ownText(rest)
}

// Labels are the slice's labels. Callers must not modify them.
func (s *Slice) Labels() map[string]string {
	if s.held == nil {
		return nil
	}
	return s.held.labels
}

// withLabels sets the slice's labels.
func (s *Slice) withLabels(labels map[string]string) {
	if labels == nil {
		return
	}
	if s.held == nil {
		s.held = &holding{}
	}
	s.held.labels = labels
}

// GetObjectKind makes Slice a runtime.Object; it carries no type information, which nothing that
// reads the cache looks at.
func (s *Slice) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// GetObjectMeta is what the informer's key function and reflector read of the slice.
func (s *Slice) GetObjectMeta() metav1.Object {
	m := s.objectMeta(s.Labels())
	return &m
}

// SliceList is a list of Slices, as the slice informer's list returns them.
type SliceList = CompactList[Slice, *Slice]

// CompactList is a page of the compact objects an informer keeps (a transformed list): client-go's
// reflector reads its Items and ResourceVersion like any list's. Items are pointers, which the
// reflector stores as they are: values it would copy one by one into objects of their own, after
// the list had held them all in one array.
type CompactList[T any, PT interface {
	*T
	runtime.Object
}] struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []PT
}

// DeepCopyObject makes CompactList a runtime.Object; the copy shares nothing with l.
func (l *CompactList[T, PT]) DeepCopyObject() runtime.Object {
	out := &CompactList[T, PT]{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	out.Items = make([]PT, len(l.Items))
	for i := range l.Items {
		out.Items[i] = l.Items[i].DeepCopyObject().(PT)
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
