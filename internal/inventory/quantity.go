package inventory

import (
	"maps"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra/internal/quantity"
)

// withoutCostlyQuantities returns attrs without the string attributes that a selector's
// quantity() would parse at a cost no check bounds: a node's plugin publishing "1e-99999999"
// (11 bytes) would hold every review that evaluates such a selector for minutes. Such a device
// looks to the checks as if it did not publish the attribute. attrs itself is returned when no
// attribute is dropped, as for every device of an honest plugin.
func withoutCostlyQuantities(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	var out map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	for n, a := range attrs {
		if a.StringValue == nil || !quantity.Costly(*a.StringValue) {
			continue
		}
		if out == nil {
			out = maps.Clone(attrs)
		}
		delete(out, n)
	}
	if out == nil {
		return attrs
	}
	return out
}
