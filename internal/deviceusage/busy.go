package deviceusage

import (
	"reflect"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/structured"
)

type poolKey struct{ driver, pool string }

// busyPools are the pools in which something may stand in a claim's way: a device that is
// allocated, tainted (by its slice or a rule), shared (its capacity may be used up) or that
// consumes more of a counter than its pool's set has. Every device of any other pool is free and
// unhindered, which is all a fleet of it would say, at a kilobyte a device.
func busyPools(slices []*resourceapi.ResourceSlice, claims []*Claim, rules map[structured.DeviceID][]string) map[poolKey]bool {
	busy := map[poolKey]bool{}
	for _, c := range claims {
		for _, r := range c.Results {
			busy[poolKey{r.Driver, r.Pool}] = true
		}
	}
	for k := range rules {
		busy[poolKey{k.Driver.String(), k.Pool.String()}] = true
	}
	var counters map[counterKey]map[string]resourceapi.Counter
	for _, sl := range slices {
		k := poolKey{sl.Spec.Driver, sl.Spec.Pool.Name}
		if busy[k] {
			continue
		}
		for i := range sl.Spec.Devices {
			d := &sl.Spec.Devices[i]
			if len(d.Taints) > 0 || (d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations) {
				busy[k] = true
				break
			}
			if len(d.ConsumesCounters) == 0 {
				continue
			}
			if counters == nil {
				counters = publishedCounters(slices)
			}
			if exceedsCounters(d, k, counters) {
				busy[k] = true
				break
			}
		}
	}
	return busy
}

// publishedCounters are the counters of every pool's counter sets, as published.
func publishedCounters(slices []*resourceapi.ResourceSlice) map[counterKey]map[string]resourceapi.Counter {
	out := map[counterKey]map[string]resourceapi.Counter{}
	for _, sl := range slices {
		for _, cs := range sl.Spec.SharedCounters {
			k := counterKey{sl.Spec.Driver, sl.Spec.Pool.Name, cs.Name}
			if _, dup := out[k]; !dup {
				out[k] = cs.Counters
			}
		}
	}
	return out
}

// exceedsCounters: d consumes more of a counter than its published set has, so that it is short
// of counters (StateBlocked) with nothing allocated.
func exceedsCounters(d *resourceapi.Device, pool poolKey, counters map[counterKey]map[string]resourceapi.Counter) bool {
	for _, cc := range d.ConsumesCounters {
		set, ok := counters[counterKey{pool.driver, pool.pool, cc.CounterSet}]
		if !ok {
			continue
		}
		for n, c := range cc.Counters {
			if have, ok := set[n]; ok && have.Value.Cmp(c.Value) < 0 {
				return true
			}
		}
	}
	return false
}

// capacities hands out one copy of the capacity values per published capacity map and driver:
// devices of one shape share that map (published.Interner makes it one) or have equal ones (a list
// decoded object by object), and a copy per device would be most of a large fleet's size. The maps'
// identities are keys while the slices that hold them are alive, which they are while Build runs;
// recent are the last distinct ones, which the next device's map is compared with.
type capacities struct {
	byMap  map[capacityKey]capacityValues
	recent []capacitySource
}

// maxRecentCapacities bounds the maps a device's is compared with: the devices of a slice, and
// of the nodes of one group, have equal ones.
const maxRecentCapacities = 8

type capacityKey struct {
	caps   uintptr
	driver string
}

type capacitySource struct {
	driver string
	caps   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
	values capacityValues
}

type capacityValues struct {
	all    map[resourceapi.QualifiedName]resource.Quantity
	memory *resource.Quantity
}

func newCapacities() *capacities {
	return &capacities{byMap: map[capacityKey]capacityValues{}}
}

func (cs *capacities) of(driver string, caps map[resourceapi.QualifiedName]resourceapi.DeviceCapacity) capacityValues {
	if len(caps) == 0 {
		return capacityValues{}
	}
	k := capacityKey{reflect.ValueOf(caps).Pointer(), driver}
	if v, ok := cs.byMap[k]; ok {
		return v
	}
	for _, r := range cs.recent {
		if r.driver == driver && sameCapacities(r.caps, caps) {
			return r.values
		}
	}
	v := capacityValues{all: make(map[resourceapi.QualifiedName]resource.Quantity, len(caps))}
	for n, c := range caps {
		v.all[n] = c.Value
	}
	if c, ok := lookupCapacity(caps, driver, "memory"); ok {
		m := c.Value.DeepCopy()
		v.memory = &m
	}
	cs.byMap[k] = v
	if len(cs.recent) == maxRecentCapacities {
		cs.recent = cs.recent[1:]
	}
	cs.recent = append(cs.recent, capacitySource{driver: driver, caps: caps, values: v})
	return v
}

// sameCapacities: a and b have the same capacities, of equal values written alike (so that they
// print alike).
func sameCapacities(a, b map[resourceapi.QualifiedName]resourceapi.DeviceCapacity) bool {
	if len(a) != len(b) {
		return false
	}
	for n, c := range a {
		d, ok := b[n]
		if !ok || c.Value.Format != d.Value.Format || c.Value.Cmp(d.Value) != 0 {
			return false
		}
	}
	return true
}
