package plugin

import (
	"context"
	"fmt"

	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// Resources is what the node publishes: one pool named after the node with all its devices in one
// slice. The kubeletplugin helper's ResourceSlice controller owns names, generations and the
// node owner reference.
func Resources(ctx context.Context, poolName string, source DeviceSource) (resourceslice.DriverResources, error) {
	devices, err := source.Devices(ctx)
	if err != nil {
		return resourceslice.DriverResources{}, fmt.Errorf("list devices for pool %s: %w", poolName, err)
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			poolName: {Slices: []resourceslice.Slice{{Devices: devices}}},
		},
	}, nil
}
