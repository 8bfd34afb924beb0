package deviceusage

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
)

// Claim is what a fleet reads of a ResourceClaim: who it is, whether it is allocated, its
// allocation's device results and its consumers. A caller that keeps every claim of a cluster
// (the webhook's informer) keeps this rather than a ResourceClaim, which is 392 bytes before it
// holds anything, and its results' 184.
type Claim struct {
	Namespace, Name string
	// Allocated: the claim has an allocation, maybe with no device results.
	Allocated   bool
	Results     []Result
	ReservedFor []resourceapi.ResourceClaimConsumerReference
}

// Result is one device result of an allocation, as the fleet reads it.
type Result struct {
	Request, Driver, Pool, Device string
	AdminAccess                   bool
	ShareID                       *types.UID
	ConsumedCapacity              map[resourceapi.QualifiedName]resource.Quantity
}

// ClaimOf is what a fleet reads of c; it shares c's maps and slices.
func ClaimOf(c *resourceapi.ResourceClaim) *Claim {
	out := &Claim{Namespace: c.Namespace, Name: c.Name, ReservedFor: c.Status.ReservedFor}
	if a := c.Status.Allocation; a != nil {
		out.Allocated = true
		out.Results = make([]Result, len(a.Devices.Results))
		for i := range a.Devices.Results {
			out.Results[i] = ResultOf(&a.Devices.Results[i])
		}
	}
	return out
}

// ResultOf is what a fleet reads of r; it shares r's share ID and consumed capacity.
func ResultOf(r *resourceapi.DeviceRequestAllocationResult) Result {
	return Result{Request: r.Request, Driver: r.Driver, Pool: r.Pool, Device: r.Device,
		AdminAccess: r.AdminAccess != nil && *r.AdminAccess, ShareID: r.ShareID, ConsumedCapacity: r.ConsumedCapacity}
}

// claimsOf converts in's claims and appends its kept ones.
func claimsOf(in Input) []*Claim {
	out := make([]*Claim, 0, len(in.Claims)+len(in.Kept))
	for _, c := range in.Claims {
		out = append(out, ClaimOf(c))
	}
	return append(out, in.Kept...)
}
