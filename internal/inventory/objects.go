// Package published is what a cluster publishes, as far as this project's checks care: its
// ResourceSlices, DeviceClasses and Nodes, converted to resource.k8s.io/v1 whatever version they
// were written or served in. It reads them from three places: informers (the webhook), one list
// call (kubectl dra against a cluster) and a YAML file (kubectl dra offline).
//
// What the objects allow — could a claim be allocated — is internal/analysis/feasibility's job.
package inventory

import (
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
)

// Objects are the published objects at one moment.
type Objects struct {
	Slices []*resourceapi.ResourceSlice
	// CompactSlices are the slices as the informers keep them; Informers.Published sets these
	// instead of Slices.
	CompactSlices []*Slice
	Classes       []*resourceapi.DeviceClass
	Nodes         []*v1.Node
	// CompactNodes are the nodes as the informers keep them, set instead of Nodes.
	CompactNodes []*Node
}

// Published returns o itself, so that a fixed set serves where a live source does.
func (o *Objects) Published() (*Objects, error) { return o, nil }
