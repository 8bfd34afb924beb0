package plugin

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// CounterSource is a DeviceSource whose devices may consume shared counters (KEP-4815
// partitionable devices); the counter sets are published next to the devices.
type CounterSource interface {
	SharedCounters(ctx context.Context) ([]resourceapi.CounterSet, error)
}

// CounterLayout is where the API server wants counter sets. The rule flipped between releases:
// 1.34 requires them in the slice of the devices that consume them, 1.35 and later forbid
// devices and counter sets in one slice. Neither OpenAPI nor discovery tells; the sharing probe
// does.
type CounterLayout int

const (
	// CountersInOwnSlices puts counter sets in slices of their own (1.35+).
	CountersInOwnSlices CounterLayout = iota
	// CountersWithDevices puts each counter set in the slice of its devices (1.34).
	CountersWithDevices
)

func (l CounterLayout) String() string {
	if l == CountersWithDevices {
		return "counters with their devices"
	}
	return "counters in their own slices"
}

// Per-slice limits of the API server's validation once devices consume counters: 64 devices
// (1.35+; 1.34 allows 128), 8 counter sets (1.35+) and 32 counters in all (1.34).
const (
	maxDevicesWithCounters = 64
	maxCounterSetsPerSlice = 8
	maxCountersPerSlice    = 32
)

// Resources is what the node publishes: one pool named after the node. Devices that consume no
// counters go in one slice, as always; counter sets and the devices consuming them are spread
// over as many slices as the API server's limits need, laid out as it wants. The kubeletplugin
// helper's ResourceSlice controller owns names, generations and the node owner reference.
func Resources(ctx context.Context, poolName string, source DeviceSource, layout CounterLayout) (resourceslice.DriverResources, error) {
	devices, err := source.Devices(ctx)
	if err != nil {
		return resourceslice.DriverResources{}, fmt.Errorf("list devices for pool %s: %w", poolName, err)
	}
	var sets []resourceapi.CounterSet
	if cs, ok := source.(CounterSource); ok {
		if sets, err = cs.SharedCounters(ctx); err != nil {
			return resourceslice.DriverResources{}, fmt.Errorf("list counter sets for pool %s: %w", poolName, err)
		}
	}
	slices := []resourceslice.Slice{{Devices: devices}}
	if len(sets) > 0 {
		if layout == CountersWithDevices {
			slices, err = slicesWithCounters(sets, devices)
		} else {
			slices = ownCounterSlices(sets, devices)
		}
		if err != nil {
			return resourceslice.DriverResources{}, fmt.Errorf("lay out pool %s: %w", poolName, err)
		}
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{poolName: {Slices: slices}},
	}, nil
}

// ownCounterSlices is the 1.35+ layout: slices of counter sets first, then slices of devices.
func ownCounterSlices(sets []resourceapi.CounterSet, devices []resourceapi.Device) []resourceslice.Slice {
	var out []resourceslice.Slice
	for len(sets) > 0 {
		n := 0
		for counters := 0; n < len(sets) && n < maxCounterSetsPerSlice && counters+len(sets[n].Counters) <= maxCountersPerSlice; n++ {
			counters += len(sets[n].Counters)
		}
		n = max(n, 1) // a set above the limits goes alone, for the API server to refuse with its reason
		out = append(out, resourceslice.Slice{SharedCounters: sets[:n:n]})
		sets = sets[n:]
	}
	for len(devices) > 0 {
		n := min(len(devices), maxDevicesWithCounters)
		out = append(out, resourceslice.Slice{Devices: devices[:n:n]})
		devices = devices[n:]
	}
	return out
}

// slicesWithCounters is the 1.34 layout: each slice holds whole counter sets with every device
// consuming them, as many as fit; devices that consume no counters follow in slices of their own.
func slicesWithCounters(sets []resourceapi.CounterSet, devices []resourceapi.Device) ([]resourceslice.Slice, error) {
	bySet := make(map[string][]resourceapi.Device, len(sets))
	for _, set := range sets {
		bySet[set.Name] = nil
	}
	var plain []resourceapi.Device
	for _, d := range devices {
		if len(d.ConsumesCounters) == 0 {
			plain = append(plain, d)
			continue
		}
		set := d.ConsumesCounters[0].CounterSet
		for _, c := range d.ConsumesCounters[1:] {
			if c.CounterSet != set {
				return nil, fmt.Errorf("device %s consumes counter sets %s and %s: one slice cannot hold both with their other devices", d.Name, set, c.CounterSet)
			}
		}
		if _, ok := bySet[set]; !ok {
			return nil, fmt.Errorf("device %s consumes counter set %s, which the node does not publish", d.Name, set)
		}
		bySet[set] = append(bySet[set], d)
	}
	var out []resourceslice.Slice
	var cur resourceslice.Slice
	counters := 0
	for _, set := range sets {
		devs := bySet[set.Name]
		if len(devs) > maxDevicesWithCounters {
			return nil, fmt.Errorf("counter set %s: %d devices consume it, more than the %d one slice may hold", set.Name, len(devs), maxDevicesWithCounters)
		}
		if len(cur.SharedCounters) > 0 && (len(cur.SharedCounters) == maxCounterSetsPerSlice ||
			counters+len(set.Counters) > maxCountersPerSlice || len(cur.Devices)+len(devs) > maxDevicesWithCounters) {
			out = append(out, cur)
			cur, counters = resourceslice.Slice{}, 0
		}
		cur.SharedCounters = append(cur.SharedCounters, set)
		cur.Devices = append(cur.Devices, devs...)
		counters += len(set.Counters)
	}
	out = append(out, cur)
	for len(plain) > 0 {
		n := min(len(plain), maxDevicesWithCounters)
		out = append(out, resourceslice.Slice{Devices: plain[:n:n]})
		plain = plain[n:]
	}
	return out, nil
}
