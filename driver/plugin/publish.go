package plugin

import (
	"context"
	"fmt"

	"k8s.io/client-go/discovery"
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

// ResourceGroup is the API group of ResourceSlices and ResourceClaims.
const ResourceGroup = "resource.k8s.io"

// knownVersions are the versions k8s.io/dynamic-resource-allocation/client converts to and from,
// newest first.
var knownVersions = []string{"v1", "v1beta2", "v1beta1"}

// ServedResourceVersion asks discovery which resource.k8s.io version the server serves, newest
// first. The library's client (used by the helper and the ResourceSlice controller) has no
// discovery of its own: it starts with v1 and moves to the next version when a call gets a 404. That
// finds the same version, but a cluster without DRA would only show up as endless 404 retries in the
// background, so the plugin checks up front and fails with a message that says what to enable.
func ServedResourceVersion(d discovery.DiscoveryInterface) (string, error) {
	groups, err := d.ServerGroups()
	if err != nil {
		return "", fmt.Errorf("discover API groups: %w", err)
	}
	served := map[string]bool{}
	for _, g := range groups.Groups {
		if g.Name != ResourceGroup {
			continue
		}
		for _, v := range g.Versions {
			served[v.Version] = true
		}
	}
	for _, v := range knownVersions {
		if served[v] {
			return v, nil
		}
	}
	return "", fmt.Errorf("the API server serves none of %s %v: enable Dynamic Resource Allocation "+
		"(Kubernetes 1.32/1.33: --feature-gates=DynamicResourceAllocation=true and --runtime-config=resource.k8s.io/v1beta1=true)",
		ResourceGroup, knownVersions)
}
