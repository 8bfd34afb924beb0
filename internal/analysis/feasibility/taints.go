package feasibility

import (
	"context"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
)

// onlyTainted explains a claim that fails only because of device taints (a driver's faulty
// devices, a DeviceTaintRule): it runs the allocator with taints ignored on the candidate nodes
// that have tainted devices, at most maxShapes of them, and names the first node where the claim
// then fits with its distinct taints. "" when no such node is found.
func (v *View) onlyTainted(ctx context.Context, s *Snapshot, namespace string, spec *resourceapi.ResourceClaimSpec, candidates []int) string {
	ignore := v.Features(ctx, s)
	ignore.DeviceTaints = false
	tried := 0
	for _, n := range candidates {
		taints := sets.New[string]()
		for d := range s.NodeDevices(n) {
			if t := s.taintOf(int(d)); t != "" {
				taints.Insert(strings.Split(t, ",")...)
			}
		}
		if taints.Len() == 0 {
			continue
		}
		if tried == maxShapes || ctx.Err() != nil {
			return ""
		}
		tried++
		state := structured.AllocatedState{
			AllocatedDevices:         sets.New[structured.DeviceID](),
			AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
			AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
		}
		if ok, _ := v.Allocate(ctx, s, n, namespace, spec, ignore, state); ok {
			return fmt.Sprintf("it can only be satisfied by tainted devices (node %s: %s); add tolerations for them to its requests, or wait until the devices are healthy again",
				s.nodes[n].Name, firstOf(sets.List(taints), 3))
		}
	}
	return ""
}

// firstOf joins at most n items and says how many more there are.
func firstOf(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:n], ", "), len(items)-n)
}
