package inventory

import (
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
)

// SliceSpec is what a Slice keeps of its ResourceSliceSpec: the fields every slice sets, the
// node's name as a string rather than a pointer to one (an allocation a slice), and behind one
// pointer, nil in most fleets, those few slices set. A kept slice is 144 bytes instead of 224.
type SliceSpec struct {
	Driver string
	Pool   resourceapi.ResourcePool
	// NodeName is spec.nodeName, "" when unset.
	NodeName string
	Devices  []resourceapi.Device
	rare     *rareSliceSpec
}

// rareSliceSpec are the fields of a ResourceSliceSpec a slice of node-local devices leaves unset.
type rareSliceSpec struct {
	// emptyNodeName is a nodeName set to "", which validation refuses but an inventory read from
	// files may hold.
	emptyNodeName          bool
	nodeSelector           *v1.NodeSelector
	allNodes               *bool
	perDeviceNodeSelection *bool
	sharedCounters         []resourceapi.CounterSet
	partitionTypeAttribute *resourceapi.FullyQualifiedName
	skipNodeOperations     []resourceapi.SkipNodeOperation
}

// NewSliceSpec is what a Slice keeps of spec. It shares spec's devices and the rare fields' values.
func NewSliceSpec(spec *resourceapi.ResourceSliceSpec) SliceSpec {
	out := SliceSpec{Driver: spec.Driver, Pool: spec.Pool, Devices: spec.Devices}
	if spec.NodeName != nil {
		out.NodeName = *spec.NodeName
	}
	rare := rareSliceSpec{
		emptyNodeName:          spec.NodeName != nil && *spec.NodeName == "",
		nodeSelector:           spec.NodeSelector,
		allNodes:               spec.AllNodes,
		perDeviceNodeSelection: spec.PerDeviceNodeSelection,
		sharedCounters:         spec.SharedCounters,
		partitionTypeAttribute: spec.PartitionTypeAttribute,
		skipNodeOperations:     spec.SkipNodeOperations,
	}
	if rare.emptyNodeName || rare.nodeSelector != nil || rare.allNodes != nil || rare.perDeviceNodeSelection != nil ||
		rare.sharedCounters != nil || rare.partitionTypeAttribute != nil || rare.skipNodeOperations != nil {
		out.rare = &rare
	}
	return out
}

// Published is the spec as published: it shares s's devices and the rare fields' values, and
// callers must not modify them.
func (s *SliceSpec) Published() resourceapi.ResourceSliceSpec {
	out := resourceapi.ResourceSliceSpec{Driver: s.Driver, Pool: s.Pool, Devices: s.Devices}
	if s.NodeName != "" || s.rare != nil && s.rare.emptyNodeName {
		nodeName := s.NodeName
		out.NodeName = &nodeName
	}
	if r := s.rare; r != nil {
		out.NodeSelector = r.nodeSelector
		out.AllNodes = r.allNodes
		out.PerDeviceNodeSelection = r.perDeviceNodeSelection
		out.SharedCounters = r.sharedCounters
		out.PartitionTypeAttribute = r.partitionTypeAttribute
		out.SkipNodeOperations = r.skipNodeOperations
	}
	return out
}

// NodeSelector is spec.nodeSelector.
func (s *SliceSpec) NodeSelector() *v1.NodeSelector {
	if s.rare == nil {
		return nil
	}
	return s.rare.nodeSelector
}

// AllNodes is spec.allNodes.
func (s *SliceSpec) AllNodes() *bool {
	if s.rare == nil {
		return nil
	}
	return s.rare.allNodes
}

// PerDeviceNodeSelection is spec.perDeviceNodeSelection.
func (s *SliceSpec) PerDeviceNodeSelection() *bool {
	if s.rare == nil {
		return nil
	}
	return s.rare.perDeviceNodeSelection
}

// SharedCounters is spec.sharedCounters.
func (s *SliceSpec) SharedCounters() []resourceapi.CounterSet {
	if s.rare == nil {
		return nil
	}
	return s.rare.sharedCounters
}
