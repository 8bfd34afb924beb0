package deviceusage

import (
	"cmp"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
)

// addAllocations records each allocated claim on its devices and gathers the AllocatedState the
// way the scheduler does (pkg/scheduler/framework/plugins/dynamicresources, foreachAllocatedDevice):
// admin access holds nothing, a result with a shareID is one share of a shared device and
// consumes capacity, any other result holds its device. byID are the fleet's devices.
func (f *Fleet) addAllocations(claims []*Claim, byID map[structured.DeviceID]*Device) {
	f.state = structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	sorted := slices.Clone(claims)
	sortStable(sorted, func(a, b *Claim) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	for _, c := range sorted {
		name := c.Namespace + "/" + c.Name
		if !c.Allocated {
			f.Pending = append(f.Pending, name)
			continue
		}
		pods, consumers := reservedFor(c)
		for _, r := range c.Results {
			a := Allocation{Claim: name, Request: r.Request, Pods: pods, Consumers: consumers,
				AdminAccess: r.AdminAccess, ConsumedCapacity: r.ConsumedCapacity}
			if r.ShareID != nil {
				a.ShareID = string(*r.ShareID)
			}
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			switch {
			case a.AdminAccess:
			case r.ShareID != nil:
				f.state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
				if r.ConsumedCapacity != nil {
					f.state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
				}
			default:
				f.state.AllocatedDevices.Insert(id)
			}
			d := byID[id]
			if d == nil {
				a.Device = id.String()
				f.Unpublished = append(f.Unpublished, a)
				continue
			}
			d.Allocations = append(d.Allocations, a)
			if !a.AdminAccess && len(r.ConsumedCapacity) > 0 {
				if d.Consumed == nil {
					d.Consumed = map[resourceapi.QualifiedName]resource.Quantity{}
				}
				for n, q := range r.ConsumedCapacity {
					sum := d.Consumed[n]
					sum.Add(q)
					d.Consumed[n] = sum
				}
			}
		}
	}
}

// reservedFor splits a claim's consumers into pods (namespace/name) and anything else.
func reservedFor(c *Claim) (pods, others []string) {
	for _, r := range c.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" {
			pods = append(pods, c.Namespace+"/"+r.Name)
			continue
		}
		res := r.Resource
		if r.APIGroup != "" {
			res += "." + r.APIGroup
		}
		others = append(others, res+"/"+r.Name)
	}
	return pods, others
}
