// Package inventory describes the GPUs of a node: what each device publishes (the schema the webhook
// checks selectors against), how many devices each node group has, and where the devices come from.
package inventory

import (
	resourceapi "k8s.io/api/resource/v1"
)

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
)

// Schema is what every device of this driver publishes. It is the one source of truth for the
// publisher and for the webhook's selector checks.
type Schema struct {
	// Attributes in the order they are documented to users.
	Attributes []AttributeSpec
	// Capacities in the order they are documented to users.
	Capacities []resourceapi.QualifiedName
}

// AttributeSpec names one attribute and its type.
type AttributeSpec struct {
	Name resourceapi.QualifiedName
	Type AttributeType
}

// DeviceSchema returns the schema of the simulated GPUs.
func DeviceSchema() Schema {
	return Schema{
		Attributes: []AttributeSpec{
			{Name: AttrIndex, Type: IntType},
			{Name: AttrModel, Type: StringType},
			{Name: AttrUUID, Type: StringType},
			{Name: AttrDriverVersion, Type: VersionType},
		},
		Capacities: []resourceapi.QualifiedName{CapMemory},
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

// HasCapacity reports whether the named capacity is published.
func (s Schema) HasCapacity(name resourceapi.QualifiedName) bool {
	for _, c := range s.Capacities {
		if c == name {
			return true
		}
	}
	return false
}
