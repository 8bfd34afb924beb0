package plugin

import (
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

// inventory is what the node publishes, by device name: which devices it has (with the index of
// their GPU), their capacities, and the counters they consume of which counter sets.
type inventory struct {
	index       map[string]int
	capacity    map[string]map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
	consumes    map[string][]resourceapi.DeviceCounterConsumption
	counterSets map[string]map[string]resourceapi.Counter
}

func newInventory(devs []resourceapi.Device, sets []resourceapi.CounterSet) *inventory {
	inv := &inventory{
		index:       make(map[string]int, len(devs)),
		capacity:    make(map[string]map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, len(devs)),
		consumes:    map[string][]resourceapi.DeviceCounterConsumption{},
		counterSets: make(map[string]map[string]resourceapi.Counter, len(sets)),
	}
	for i, dev := range devs {
		index := i
		if a, ok := dev.Attributes[deviceschema.AttrIndex]; ok && a.IntValue != nil {
			index = int(*a.IntValue)
		}
		inv.index[dev.Name] = index
		inv.capacity[dev.Name] = dev.Capacity
		if len(dev.ConsumesCounters) > 0 {
			inv.consumes[dev.Name] = dev.ConsumesCounters
		}
	}
	for _, set := range sets {
		inv.counterSets[set.Name] = set.Counters
	}
	return inv
}
