package feasibility

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
)

// Request is an exact request or a firstAvailable subrequest, with what the checks read of it.
type Request struct {
	// Index is the request's position in the claim's requests.
	Index int
	// Subrequest is the subrequest's position in the request's firstAvailable, -1 for an exact
	// request.
	Subrequest int
	// Name is the request's name, or the subrequest's reference ("request/subrequest", as
	// allocation results and constraints name it).
	Name        string
	Class       string
	Selectors   []resourceapi.DeviceSelector
	Mode        resourceapi.DeviceAllocationMode
	Count       int64
	AdminAccess bool
	Tolerations []resourceapi.DeviceToleration
	Capacity    *resourceapi.CapacityRequirements
}

// Requests lists the exact requests and firstAvailable subrequests of spec, in order: the one
// place a claim's requests are flattened (resourceclaim.BaseRequestRef gives a subrequest's
// request back).
func Requests(spec *resourceapi.ResourceClaimSpec) []*Request {
	var out []*Request
	for i, r := range spec.Devices.Requests {
		if e := r.Exactly; e != nil {
			out = append(out, &Request{Index: i, Subrequest: -1, Name: r.Name, Class: e.DeviceClassName, Selectors: e.Selectors, Mode: e.AllocationMode, Count: e.Count,
				AdminAccess: e.AdminAccess != nil && *e.AdminAccess, Tolerations: e.Tolerations, Capacity: e.Capacity})
		}
		for j, sub := range r.FirstAvailable {
			out = append(out, &Request{Index: i, Subrequest: j, Name: resourceclaim.CreateSubRequestRef(r.Name, sub.Name), Class: sub.DeviceClassName, Selectors: sub.Selectors, Mode: sub.AllocationMode,
				Count: sub.Count, Tolerations: sub.Tolerations, Capacity: sub.Capacity})
		}
	}
	return out
}
