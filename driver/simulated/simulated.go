// Package simulated is the first device source of the plugin: GPUs that exist only on paper,
// shaped by the node's group in the node-groups file. A hardware backend would sit next to it and
// implement the same plugin.DeviceSource; publishing and prepare do not know which one runs.
package simulated

import (
	"context"
	"crypto/sha256"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// DeviceUUID derives a UUID-shaped identifier from the node name and device index. It is a hash, not
// random, so a restarted plugin publishes the same uuid attribute and selectors that pin a device by
// uuid keep matching.
func DeviceUUID(nodeName string, index int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d", nodeName, index))
	return fmt.Sprintf("gpu-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}

// GPUs are the simulated GPUs of one node.
type GPUs struct {
	nodeName string
	spec     nodegroups.GroupSpec
}

// New returns the simulated GPUs of a node. Unset fields of spec get the built-in defaults.
func New(nodeName string, spec nodegroups.GroupSpec) *GPUs {
	return &GPUs{nodeName: nodeName, spec: spec.WithDefaults()}
}

// Devices lists the node's GPUs in index order, with exactly the attributes and capacities of
// deviceschema.DeviceSchema and nothing behind a feature gate, so every served API version stores them unchanged.
func (s *GPUs) Devices(_ context.Context) ([]resourceapi.Device, error) {
	devices := make([]resourceapi.Device, 0, s.spec.Count)
	for i := 0; i < s.spec.Count; i++ {
		devices = append(devices, resourceapi.Device{
			Name: deviceschema.DeviceName(i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				deviceschema.AttrIndex:         {IntValue: ptr.To(int64(i))},
				deviceschema.AttrUUID:          {StringValue: ptr.To(DeviceUUID(s.nodeName, i))},
				deviceschema.AttrModel:         {StringValue: ptr.To(s.spec.Model)},
				deviceschema.AttrDriverVersion: {VersionValue: ptr.To(deviceschema.DefaultDriverVersion)},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				deviceschema.CapMemory: {Value: s.memory()},
			},
		})
	}
	return devices, nil
}

func (s *GPUs) memory() resource.Quantity {
	if s.spec.Memory == nil {
		return deviceschema.DefaultMemory.DeepCopy()
	}
	return s.spec.Memory.DeepCopy()
}
