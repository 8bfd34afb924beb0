// Package simulated is the first device source of the plugin: GPUs that exist only on paper,
// shaped by the node's group in the node-groups file. A hardware backend would sit next to it and
// implement the same plugin.DeviceSource; publishing and prepare do not know which one runs.
package simulated

import (
	"context"
	"crypto/sha256"
	"fmt"
	"maps"

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

// Devices lists the node's GPUs in index order. Exclusive GPUs have exactly the attributes and
// capacities of deviceschema.DeviceSchema and nothing behind a feature gate, so every served API
// version stores them unchanged. Shared-memory GPUs add what consumable capacity (KEP-5075) needs:
// allowMultipleAllocations, and a request policy on memory and on compute (which only they
// publish). Partitioned GPUs are each their partitions and then the whole GPU, all consuming the
// GPU's counters (KEP-4815, see SharedCounters); shared-partition GPUs are the same devices, each
// shared as a shared-memory GPU is. Attachable GPUs are exclusive GPUs with binding conditions
// (KEP-5007). The caller publishes the last four only where the API server keeps those fields.
func (s *GPUs) Devices(_ context.Context) ([]resourceapi.Device, error) {
	devices := make([]resourceapi.Device, 0, s.spec.Count)
	for i := 0; i < s.spec.Count; i++ {
		dev := resourceapi.Device{
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
		}
		switch s.spec.ModeOf() {
		case nodegroups.SharedMemory:
			dev.AllowMultipleAllocations = ptr.To(true)
			dev.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				deviceschema.CapMemory:  shared(s.memory(), s.spec.Sharing.MemoryPolicy()),
				deviceschema.CapCompute: shared(deviceschema.DefaultCompute.DeepCopy(), s.spec.Sharing.ComputePolicy()),
			}
		case nodegroups.Partitioned, nodegroups.SharedPartitions:
			devices = append(devices, s.partitions(i, dev)...)
			continue
		case nodegroups.Attachable:
			// The node's own slice already pins an allocation to this node, so bindsToNode
			// (for devices several nodes reach) has nothing to add.
			dev.BindingConditions = []string{deviceschema.ConditionAttached}
			dev.BindingFailureConditions = []string{deviceschema.ConditionAttachFailed}
		}
		devices = append(devices, dev)
	}
	return devices, nil
}

// SharedCounters are the counter sets of partitioned GPUs, one per GPU with its whole memory and
// compute; none in the other modes.
func (s *GPUs) SharedCounters(_ context.Context) ([]resourceapi.CounterSet, error) {
	if !s.spec.ModeOf().Partitions() {
		return nil, nil
	}
	sets := make([]resourceapi.CounterSet, 0, s.spec.Count)
	for i := 0; i < s.spec.Count; i++ {
		sets = append(sets, resourceapi.CounterSet{
			Name:     deviceschema.CounterSetName(i),
			Counters: counters(s.memory(), deviceschema.DefaultCompute.DeepCopy()),
		})
	}
	return sets, nil
}

// partitions are what one partitioned GPU publishes instead of gpu: its partitions, each with an
// equal part of memory and compute (rounded down, so that they always fit together), then the
// whole GPU. The scheduler sees them consume the GPU's counters and so never allocates a
// partition together with the whole GPU.
func (s *GPUs) partitions(index int, gpu resourceapi.Device) []resourceapi.Device {
	n := s.spec.Sharing.Partitions
	memory, compute := s.memory(), deviceschema.DefaultCompute.DeepCopy()
	partMemory, partCompute := nodegroups.PartOf(memory, n), nodegroups.PartOf(compute, n)
	out := make([]resourceapi.Device, 0, n+1)
	device := func(name string, mem, comp resource.Quantity, extra map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) resourceapi.Device {
		attrs := maps.Clone(gpu.Attributes)
		attrs[deviceschema.AttrPartitionable] = resourceapi.DeviceAttribute{BoolValue: ptr.To(true)}
		maps.Copy(attrs, extra)
		dev := resourceapi.Device{
			Name:       name,
			Attributes: attrs,
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				deviceschema.CapMemory:  {Value: mem},
				deviceschema.CapCompute: {Value: comp},
			},
			ConsumesCounters: []resourceapi.DeviceCounterConsumption{{
				CounterSet: deviceschema.CounterSetName(index),
				Counters:   counters(mem, comp),
			}},
		}
		if s.spec.ModeOf() == nodegroups.SharedPartitions {
			// Shares of the device, within its own capacity; the scheduler charges its
			// counters once, however many claims share it.
			dev.AllowMultipleAllocations = ptr.To(true)
			dev.Capacity[deviceschema.CapMemory] = shared(mem, s.spec.Sharing.MemoryPolicy())
			dev.Capacity[deviceschema.CapCompute] = shared(comp, s.spec.Sharing.ComputePolicy())
		}
		return dev
	}
	for j := range n {
		out = append(out, device(deviceschema.PartitionDeviceName(index, j), partMemory, partCompute,
			map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{deviceschema.AttrPartition: {IntValue: ptr.To(int64(j))}}))
	}
	return append(out, device(deviceschema.FullDeviceName(index), memory, compute,
		map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{deviceschema.AttrFull: {BoolValue: ptr.To(true)}}))
}

func counters(memory, compute resource.Quantity) map[string]resourceapi.Counter {
	return map[string]resourceapi.Counter{
		string(deviceschema.CapMemory):  {Value: memory.DeepCopy()},
		string(deviceschema.CapCompute): {Value: compute.DeepCopy()},
	}
}

// shared is a capacity of a shared GPU: a claim that names no amount gets all of it (as with the
// reference driver; at most the policy's max), one that does gets its request rounded up to the
// policy's steps.
func shared(total resource.Quantity, p nodegroups.CapacityPolicy) resourceapi.DeviceCapacity {
	max := total.DeepCopy()
	if p.Max != nil {
		max = p.Max.DeepCopy()
	}
	return resourceapi.DeviceCapacity{
		Value: total,
		RequestPolicy: &resourceapi.CapacityRequestPolicy{
			Default: ptr.To(max.DeepCopy()),
			ValidRange: &resourceapi.CapacityRequestPolicyRange{
				Min:  ptr.To(p.Min.DeepCopy()),
				Step: ptr.To(p.Step.DeepCopy()),
				Max:  &max,
			},
		},
	}
}

func (s *GPUs) memory() resource.Quantity {
	if s.spec.Memory == nil {
		return deviceschema.DefaultMemory.DeepCopy()
	}
	return s.spec.Memory.DeepCopy()
}
