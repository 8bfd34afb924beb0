// Package deviceschema is the contract between the kubelet plugin and everything that judges
// claims for it (the webhook, kubectl dra): the driver's default name (which is also the attribute
// domain), how devices are named, which attributes and capacities every device publishes with
// which CEL type, and the default values the seed's example driver publishes.
//
// Which node has how many devices of which model is internal/nodegroups; where the devices of one
// node come from is driver/simulated (or a hardware backend).
package deviceschema

import (
	"fmt"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// DefaultDriverName is the DRA driver name (and attribute domain) of the seed's example driver,
// which its manifests name: every binary's --driver-name defaults to it.
const DefaultDriverName = "gpu.example.com"

// ValidateDriverName checks a driver name given by flag: a DNS subdomain, as the DeviceClass's
// driver field and the attribute domain need.
func ValidateDriverName(flag, name string) error {
	if name == "" {
		return fmt.Errorf("%s: required, e.g. %s", flag, DefaultDriverName)
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return fmt.Errorf("%s=%q: %s; use a DNS subdomain, e.g. %s", flag, name, strings.Join(msgs, "; "), DefaultDriverName)
	}
	return nil
}

// Defaults of each device, as the seed's example driver publishes them.
const (
	DefaultCount         = 8
	DefaultModel         = "LATEST-GPU-MODEL"
	DefaultDriverVersion = "1.0.0"
)

// DefaultMemory is the memory capacity of each device unless its node group says otherwise.
var DefaultMemory = resource.MustParse("80Gi")

// DefaultCompute is the compute capacity of each device that publishes one (GPUs shared by
// consumable capacity), as the upstream reference driver publishes it: a GPU is 100 units.
var DefaultCompute = resource.MustParse("100")

// DeviceName is the name of the device with the given index on its node: gpu-0, gpu-1, ...
func DeviceName(index int) string { return fmt.Sprintf("gpu-%d", index) }

// PartitionDeviceName, FullDeviceName and CounterSetName name what a partitioned GPU publishes
// (KEP-4815), as the upstream reference driver does: its partitions gpu-<i>-partition-<j>, the
// whole GPU gpu-<i>-full, and the counters both consume, gpu-<i>-counters.
func PartitionDeviceName(index, partition int) string {
	return fmt.Sprintf("gpu-%d-partition-%d", index, partition)
}
func FullDeviceName(index int) string { return fmt.Sprintf("gpu-%d-full", index) }
func CounterSetName(index int) string { return fmt.Sprintf("gpu-%d-counters", index) }

// The binding conditions of an attachable GPU (KEP-5007): the scheduler binds a pod to the node
// once the plugin sets ConditionAttached True in the claim's status.devices entry, and allocates
// again once it sets ConditionAttachFailed True.
const (
	ConditionAttached     = "Attached"
	ConditionAttachFailed = "AttachFailed"
)

// EnvID is how a device is named in the environment of a container (GPU_DEVICE_<id>): the GPU's
// index for a whole GPU, else the device name after "gpu-" in upper case with "-" as "_"
// (0_PARTITION_1, 0_FULL), as the reference driver does.
func EnvID(deviceName string, index int) string {
	rest, ok := strings.CutPrefix(deviceName, "gpu-")
	if !ok || deviceName == DeviceName(index) {
		return strconv.Itoa(index)
	}
	return strings.ToUpper(strings.ReplaceAll(rest, "-", "_"))
}

// AttributeType is the type of a published attribute as CEL sees it.
type AttributeType string

const (
	IntType     AttributeType = "int"
	StringType  AttributeType = "string"
	BoolType    AttributeType = "bool"
	VersionType AttributeType = "version"
)

// Attribute and capacity names this driver publishes, in its own domain (the driver name).
const (
	AttrIndex         resourceapi.QualifiedName = "index"
	AttrUUID          resourceapi.QualifiedName = "uuid"
	AttrModel         resourceapi.QualifiedName = "model"
	AttrDriverVersion resourceapi.QualifiedName = "driverVersion"
	CapMemory         resourceapi.QualifiedName = "memory"
	// CapCompute is published by GPUs shared by consumable capacity (node groups in
	// shared-memory mode; the reference driver's demos request a share of it) and by partitioned
	// GPUs' devices, not by exclusive GPUs.
	CapCompute resourceapi.QualifiedName = "compute"
)

// Attributes that only partitioned GPUs' devices publish: a partition's number, that a device is
// one of the ways to use a partitionable GPU, and that it is the whole of one.
const (
	AttrPartition     resourceapi.QualifiedName = "partition"
	AttrPartitionable resourceapi.QualifiedName = "partitionable"
	AttrFull          resourceapi.QualifiedName = "full"
)

// Which devices publish what every device does not (AttributeSpec.Only, CapacitySpec.Only).
const (
	OnlyPartitioned = "partitioned GPUs"
	OnlyPartitions  = "partitions of partitioned GPUs"
	OnlyWhole       = "the whole-GPU devices of partitioned GPUs"
	OnlySharing     = "shared-memory and partitioned GPUs"
)

// Schema is what the devices of this driver publish. It is the one source of truth for the
// publisher and for the webhook's selector checks: a selector reading a name it lacks is a typo.
type Schema struct {
	// Attributes in the order they are documented to users.
	Attributes []AttributeSpec
	// Capacities in the order they are documented to users.
	Capacities []CapacitySpec
}

// AttributeSpec names one attribute and its type.
type AttributeSpec struct {
	Name resourceapi.QualifiedName
	Type AttributeType
	// Only, when set, names the devices that publish it; every device does otherwise. A selector
	// reading it on other devices fails at runtime unless it asks first ("name" in ...).
	Only string
}

// CapacitySpec names one capacity.
type CapacitySpec struct {
	Name resourceapi.QualifiedName
	// Only is as AttributeSpec.Only.
	Only string
}

// DeviceSchema returns the schema of the simulated GPUs in every sharing mode.
func DeviceSchema() Schema {
	return Schema{
		Attributes: []AttributeSpec{
			{Name: AttrIndex, Type: IntType},
			{Name: AttrModel, Type: StringType},
			{Name: AttrUUID, Type: StringType},
			{Name: AttrDriverVersion, Type: VersionType},
			{Name: AttrPartitionable, Type: BoolType, Only: OnlyPartitioned},
			{Name: AttrPartition, Type: IntType, Only: OnlyPartitions},
			{Name: AttrFull, Type: BoolType, Only: OnlyWhole},
		},
		Capacities: []CapacitySpec{
			{Name: CapMemory},
			{Name: CapCompute, Only: OnlySharing},
		},
	}
}

// Attribute returns the spec of the named attribute.
func (s Schema) Attribute(name resourceapi.QualifiedName) (AttributeSpec, bool) {
	for _, a := range s.Attributes {
		if a.Name == name {
			return a, true
		}
	}
	return AttributeSpec{}, false
}

// HasCapacity reports whether the named capacity is published (by some device).
func (s Schema) HasCapacity(name resourceapi.QualifiedName) bool {
	for _, c := range s.Capacities {
		if c.Name == name {
			return true
		}
	}
	return false
}
