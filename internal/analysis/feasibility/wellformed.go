package feasibility

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
)

// WellFormed reports the first structural fault of spec that the API server's validation refuses
// and the scheduler's allocator takes for granted (it panics on some: a duplicate request name
// makes it look up the wrong request, an empty one mistakes a firstAvailable request for an exact
// one). The API server validates before calling webhooks, but a review can be sent by anyone and
// kubectl dra validates files offline, so the feasibility check gives no verdict on such a spec
// rather than trusting it.
func WellFormed(spec *resourceapi.ResourceClaimSpec) error {
	names := sets.New[string]()
	for i, r := range spec.Devices.Requests {
		if errs := validation.IsDNS1123Label(r.Name); len(errs) > 0 {
			return fmt.Errorf("spec.devices.requests[%d].name: %q: %s", i, r.Name, strings.Join(errs, "; "))
		}
		if names.Has(r.Name) {
			return fmt.Errorf("spec.devices.requests[%d].name: duplicate name %q", i, r.Name)
		}
		names.Insert(r.Name)
		if (r.Exactly == nil) == (len(r.FirstAvailable) == 0) {
			return fmt.Errorf("spec.devices.requests[%d]: exactly one of exactly and firstAvailable must be set", i)
		}
		subs := sets.New[string]()
		for j, sub := range r.FirstAvailable {
			if errs := validation.IsDNS1123Label(sub.Name); len(errs) > 0 {
				return fmt.Errorf("spec.devices.requests[%d].firstAvailable[%d].name: %q: %s", i, j, sub.Name, strings.Join(errs, "; "))
			}
			if subs.Has(sub.Name) {
				return fmt.Errorf("spec.devices.requests[%d].firstAvailable[%d].name: duplicate name %q", i, j, sub.Name)
			}
			subs.Insert(sub.Name)
		}
	}
	for i, c := range spec.Devices.Constraints {
		for j, name := range c.Requests {
			if !names.Has(resourceclaim.BaseRequestRef(name)) {
				return fmt.Errorf("spec.devices.constraints[%d].requests[%d]: no request named %q", i, j, name)
			}
		}
	}
	return nil
}
