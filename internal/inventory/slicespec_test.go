package inventory

import (
	"testing"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"
)

// TestSliceSpecPublished: a spec kept as a SliceSpec comes back as published, whichever of the
// node-selection and counter fields it sets, and only a spec that sets one of the rare fields
// keeps them behind a pointer.
func TestSliceSpecPublished(t *testing.T) {
	base := func() resourceapi.ResourceSliceSpec {
		return resourceapi.ResourceSliceSpec{
			Driver:  "gpu.example.com",
			Pool:    resourceapi.ResourcePool{Name: "node-1", Generation: 3, ResourceSliceCount: 2},
			Devices: []resourceapi.Device{{Name: "gpu-0"}},
		}
	}
	tests := []struct {
		name string
		set  func(*resourceapi.ResourceSliceSpec)
		rare bool
	}{
		{name: "node name", set: func(s *resourceapi.ResourceSliceSpec) { s.NodeName = ptr.To("node-1") }},
		{name: "no node name", set: func(*resourceapi.ResourceSliceSpec) {}},
		{name: "empty node name", set: func(s *resourceapi.ResourceSliceSpec) { s.NodeName = ptr.To("") }, rare: true},
		{name: "node selector", rare: true, set: func(s *resourceapi.ResourceSliceSpec) {
			s.NodeSelector = &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{
				{Key: "rack", Operator: v1.NodeSelectorOpIn, Values: []string{"a"}}}}}}
		}},
		{name: "all nodes", set: func(s *resourceapi.ResourceSliceSpec) { s.AllNodes = ptr.To(true) }, rare: true},
		{name: "per-device node selection", set: func(s *resourceapi.ResourceSliceSpec) { s.PerDeviceNodeSelection = ptr.To(true) }, rare: true},
		{name: "shared counters", rare: true, set: func(s *resourceapi.ResourceSliceSpec) {
			s.NodeName = ptr.To("node-1")
			s.SharedCounters = []resourceapi.CounterSet{{Name: "gpu-0-counters"}}
		}},
		{name: "partition type attribute", rare: true, set: func(s *resourceapi.ResourceSliceSpec) {
			s.PartitionTypeAttribute = ptr.To(resourceapi.FullyQualifiedName("gpu.example.com/partition"))
		}},
		{name: "skip node operations", rare: true, set: func(s *resourceapi.ResourceSliceSpec) {
			s.SkipNodeOperations = []resourceapi.SkipNodeOperation{"Prepare"}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := base()
			tt.set(&spec)
			kept := NewSliceSpec(&spec)
			if got := kept.rare != nil; got != tt.rare {
				t.Errorf("rare fields kept behind a pointer: %v, want %v", got, tt.rare)
			}
			if got := kept.Published(); !apiequality.Semantic.DeepEqual(got, spec) {
				t.Errorf("published spec differs:\n got %+v\nwant %+v", got, spec)
			}
			if kept.NodeSelector() != spec.NodeSelector || kept.AllNodes() != spec.AllNodes ||
				kept.PerDeviceNodeSelection() != spec.PerDeviceNodeSelection || len(kept.SharedCounters()) != len(spec.SharedCounters) {
				t.Error("an accessor does not return the spec's field")
			}
		})
	}
}

// TestSliceDeepCopySharesNothing: the copy the informer's store asks for shares none of the rare
// fields with the kept slice.
func TestSliceDeepCopySharesNothing(t *testing.T) {
	spec := resourceapi.ResourceSliceSpec{Driver: "gpu.example.com", AllNodes: ptr.To(true),
		SharedCounters: []resourceapi.CounterSet{{Name: "gpu-0-counters"}}}
	s := &Slice{Meta: Meta{Name: "s"}, Spec: NewSliceSpec(&spec)}
	c := s.DeepCopyObject().(*Slice)
	*c.Spec.AllNodes() = false
	c.Spec.SharedCounters()[0].Name = "changed"
	if !*s.Spec.AllNodes() || s.Spec.SharedCounters()[0].Name != "gpu-0-counters" {
		t.Error("the copy shares the kept slice's fields")
	}
}

// TestSliceSize: a kept slice fits the allocator's 144-byte class; with its whole spec and a
// separate node name it took 208 and 16.
func TestSliceSize(t *testing.T) {
	if got := unsafe.Sizeof(Slice{}); got > 144 {
		t.Errorf("a Slice is %d bytes, want at most 144", got)
	}
}
