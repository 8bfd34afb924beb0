package plugin

import (
	"errors"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/gpu-dra/gpu-dra/driver/api/v1alpha1"
	"github.com/gpu-dra/gpu-dra/driver/cdi"
	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
)

// decodedConfig is one opaque config of this driver from the allocation, in application order.
type decodedConfig struct {
	requests []string
	config   *v1alpha1.GpuConfig
}

// allocationConfigs decodes every opaque config of this driver in the claim's allocation, class
// configs before claim configs (each group in its listed order), because a claim's own config is
// more specific than its class's and must win. Configs of other drivers are not ours to judge. Any
// bad config fails the whole claim: preparing with a setting the user did not ask for is worse than
// not preparing.
func allocationConfigs(driverName string, allocation *resourceapi.AllocationResult) ([]decodedConfig, error) {
	base := field.NewPath("status", "allocation", "devices", "config")
	var fromClass, fromClaim []decodedConfig
	var errs []error
	for i, c := range allocation.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != driverName {
			continue
		}
		path := base.Index(i).Child("opaque", "parameters")
		cfg, cerrs := v1alpha1.Decode(c.Opaque.Parameters.Raw, path)
		if len(cerrs) > 0 {
			// Decode names the field (e.g. ...parameters.sharing.strategy) and the allowed values.
			errs = append(errs, cerrs.ToAggregate())
			continue
		}
		dc := decodedConfig{requests: c.Requests, config: cfg}
		switch c.Source {
		case resourceapi.AllocationConfigSourceClass:
			fromClass = append(fromClass, dc)
		case resourceapi.AllocationConfigSourceClaim:
			fromClaim = append(fromClaim, dc)
		default:
			errs = append(errs, field.NotSupported(base.Index(i).Child("source"), c.Source,
				[]string{string(resourceapi.AllocationConfigSourceClass), string(resourceapi.AllocationConfigSourceClaim)}))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return append(fromClass, fromClaim...), nil
}

// configFor returns the config that applies to a device allocated for request: the last matching
// config, or the default. A config with no requests applies to all; one naming the parent request
// also applies to its subrequests.
func configFor(configs []decodedConfig, request string) *v1alpha1.GpuConfig {
	cfg := v1alpha1.DefaultGpuConfig()
	for _, c := range configs {
		if len(c.requests) == 0 || slices.Contains(c.requests, request) || slices.Contains(c.requests, resourceclaim.BaseRequestRef(request)) {
			cfg = c.config
		}
	}
	return cfg
}

func sharingOf(cfg *v1alpha1.GpuConfig) checkpoint.Sharing {
	s := cfg.Sharing
	out := checkpoint.Sharing{Strategy: string(s.Strategy)}
	switch s.Strategy {
	case v1alpha1.TimeSlicingStrategy:
		out.TimeSliceInterval = string(v1alpha1.DefaultTimeSlice)
		if s.TimeSlicingConfig != nil && s.TimeSlicingConfig.Interval != "" {
			out.TimeSliceInterval = string(s.TimeSlicingConfig.Interval)
		}
	case v1alpha1.SpacePartitioningStrategy:
		if s.SpacePartitioningConfig != nil {
			out.PartitionCount = s.SpacePartitioningConfig.PartitionCount
		}
	}
	return out
}

// claimDevices turns a claim's allocation into the devices to prepare, checking that each device of
// this driver is one this node has.
func claimDevices(driverName, poolName string, inv *inventory, claim *resourceapi.ResourceClaim) ([]checkpoint.PreparedDevice, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s: status.allocation: not allocated", claim.Namespace, claim.Name)
	}
	configs, err := allocationConfigs(driverName, claim.Status.Allocation)
	if err != nil {
		return nil, fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	var out []checkpoint.PreparedDevice
	results := field.NewPath("status", "allocation", "devices", "results")
	for i, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != driverName {
			continue
		}
		index, ok := inv.index[r.Device]
		if r.Pool != poolName || !ok {
			return nil, fmt.Errorf("claim %s/%s: %s: device %s/%s is not a device of this node (pool %s)",
				claim.Namespace, claim.Name, results.Index(i), r.Pool, r.Device, poolName)
		}
		dev := checkpoint.PreparedDevice{
			Request:     r.Request,
			Pool:        r.Pool,
			Device:      r.Device,
			Index:       index,
			Sharing:     sharingOf(configFor(configs, r.Request)),
			AdminAccess: r.AdminAccess != nil && *r.AdminAccess,
			CDIDevice:   cdi.DeviceName(claim.UID, r.Device),
		}
		if r.ShareID != nil {
			// One share of a device that other claims (or other requests of this one) share too.
			dev.ShareID = string(*r.ShareID)
			dev.CDIDevice = cdi.ShareDeviceName(claim.UID, r.Device, dev.ShareID)
			dev.ConsumedCapacity = quantities(r.ConsumedCapacity, func(q resource.Quantity) resource.Quantity { return q })
		} else if len(inv.consumes[r.Device]) > 0 {
			// A partition (or the whole) of a partitionable GPU: its container learns its size.
			dev.Capacity = quantities(inv.capacity[r.Device], func(c resourceapi.DeviceCapacity) resource.Quantity { return c.Value })
		}
		out = append(out, dev)
	}
	return out, nil
}

// quantities is a map of capacities by name as the checkpoint records it; nil when empty.
func quantities[V any](in map[resourceapi.QualifiedName]V, value func(V) resource.Quantity) map[string]resource.Quantity {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]resource.Quantity, len(in))
	for name, v := range in {
		out[string(name)] = value(v).DeepCopy()
	}
	return out
}
