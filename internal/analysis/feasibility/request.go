package feasibility

import (
	resourceapi "k8s.io/api/resource/v1"
)

// Request is an exact request or a firstAvailable subrequest, with what the checks read of it.
type Request struct {
	// Index is the request's position in the claim's requests.
	Index int
	// Name is the request's name, "request/subrequest" for a firstAvailable subrequest.
	Name        string
	Class       string
	Selectors   []resourceapi.DeviceSelector
	Mode        resourceapi.DeviceAllocationMode
	Count       int64
	AdminAccess bool
	Tolerations []resourceapi.DeviceToleration
	Capacity    *resourceapi.CapacityRequirements
}

// Requests lists the exact requests and firstAvailable subrequests of spec, in order.
func Requests(spec *resourceapi.ResourceClaimSpec) []*Request {
	var out []*Request
	for i, r := range spec.Devices.Requests {
		if e := r.Exactly; e != nil {
			out = append(out, &Request{Index: i, Name: r.Name, Class: e.DeviceClassName, Selectors: e.Selectors, Mode: e.AllocationMode, Count: e.Count,
				AdminAccess: e.AdminAccess != nil && *e.AdminAccess, Tolerations: e.Tolerations, Capacity: e.Capacity})
		}
		for _, sub := range r.FirstAvailable {
			out = append(out, &Request{Index: i, Name: r.Name + "/" + sub.Name, Class: sub.DeviceClassName, Selectors: sub.Selectors, Mode: sub.AllocationMode,
				Count: sub.Count, Tolerations: sub.Tolerations, Capacity: sub.Capacity})
		}
	}
	return out
}
