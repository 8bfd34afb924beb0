package inventory

import (
	"context"
	"crypto/sha256"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// DeviceName is the name of the device with the given index, as the seed's example driver names it.
func DeviceName(index int) string { return fmt.Sprintf("gpu-%d", index) }

// DeviceUUID derives a UUID-shaped identifier from the node name and device index. It is a hash, not
// random, so a restarted plugin publishes the same uuid attribute and selectors that pin a device by
// uuid keep matching.
func DeviceUUID(nodeName string, index int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d", nodeName, index))
	return fmt.Sprintf("gpu-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}

// Simulated is the first device source: GPUs that exist only on paper, shaped by a GroupSpec.
type Simulated struct {
	nodeName string
	spec     GroupSpec
}

// NewSimulated returns the simulated GPUs of a node. Unset fields of spec get the built-in defaults.
func NewSimulated(nodeName string, spec GroupSpec) *Simulated {
	return &Simulated{nodeName: nodeName, spec: (&Config{}).merge(spec)}
}

// Devices lists the node's GPUs in index order, with exactly the attributes and capacities of
// DeviceSchema and nothing behind a feature gate, so every served API version stores them unchanged.
func (s *Simulated) Devices(_ context.Context) ([]resourceapi.Device, error) {
	devices := make([]resourceapi.Device, 0, s.spec.Count)
	for i := 0; i < s.spec.Count; i++ {
		devices = append(devices, resourceapi.Device{
			Name: DeviceName(i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				AttrIndex:         {IntValue: ptr.To(int64(i))},
				AttrUUID:          {StringValue: ptr.To(DeviceUUID(s.nodeName, i))},
				AttrModel:         {StringValue: ptr.To(s.spec.Model)},
				AttrDriverVersion: {VersionValue: ptr.To(DefaultDriverVersion)},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				CapMemory: {Value: s.memory()},
			},
		})
	}
	return devices, nil
}

func (s *Simulated) memory() resource.Quantity {
	if s.spec.Memory == nil {
		return DefaultMemory.DeepCopy()
	}
	return s.spec.Memory.DeepCopy()
}
