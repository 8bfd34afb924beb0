package feasibility

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// withCapacity narrows dm to the devices that could hold the capacity requests of a request if
// nothing else were allocated (KEP-5075): each requested capacity is published, and the amount
// the device would set aside for it (the request rounded up as its requestPolicy says) is within
// the policy and within the capacity. Without capacity requests dm is returned as it is. When
// dm's devices all fall short, why says so, naming the capacities and the most any of them offers.
func (s *Snapshot) withCapacity(dm *Matches, capacity *resourceapi.CapacityRequirements) (*Matches, string) {
	if capacity == nil || len(capacity.Requests) == 0 {
		return dm, ""
	}
	names := make([]string, 0, len(capacity.Requests))
	for n := range capacity.Requests {
		names = append(names, string(n))
	}
	slices.Sort(names)
	key := capacityKey(dm, capacity, names)
	if cached, ok := s.matchResults.Get(key); ok {
		c := cached.(*capacityMatches)
		return c.dm, c.why
	}
	out, seen := s.holdingCapacity(dm, capacity, names)
	why := ""
	if seen.selected > 0 && out.Count() == 0 {
		why = seen.why(capacity, names)
	}
	s.matchResults.Add(key, &capacityMatches{dm: out, why: why})
	return out, why
}

// capacityKey is what withCapacity's answer is cached by: the devices dm matched and the
// capacity requests (names sorted).
func capacityKey(dm *Matches, capacity *resourceapi.CapacityRequirements, names []string) string {
	h := sha256.New()
	for _, m := range dm.Matched {
		if m {
			h.Write([]byte{1})
		} else {
			h.Write([]byte{0})
		}
	}
	for _, n := range names {
		q := capacity.Requests[resourceapi.QualifiedName(n)]
		fmt.Fprintf(h, "\x00%s=%s", n, q.String())
	}
	return "capacity\x00" + string(h.Sum(nil))
}

// capacitySeen is what holdingCapacity saw of the devices dm matched, for the message when none
// of them holds the requests.
type capacitySeen struct {
	selected int
	// most is, per requested capacity, the largest amount a selected device could set aside.
	most map[string]resource.Quantity
	// missing counts, per requested capacity, the selected devices that do not publish it.
	missing map[string]int
	// heldBySome: some selected device could hold the request's amount of this capacity.
	heldBySome map[string]bool
}

// holdingCapacity narrows dm to the devices that could hold every capacity request.
func (s *Snapshot) holdingCapacity(dm *Matches, capacity *resourceapi.CapacityRequirements, names []string) (*Matches, *capacitySeen) {
	out := &Matches{Counts: make([]int, len(s.nodes)), Matched: make([]bool, len(s.devices))}
	seen := &capacitySeen{most: map[string]resource.Quantity{}, missing: map[string]int{}, heldBySome: map[string]bool{}}
	for d, m := range dm.Matched {
		if !m {
			continue
		}
		seen.selected++
		caps := s.dev(d).published().Capacity
		fits := true
		for _, n := range names {
			c, ok := caps[resourceapi.QualifiedName(n)]
			if !ok {
				seen.missing[n]++
				fits = false
				continue
			}
			limit := capacityLimit(c)
			if cur, ok := seen.most[n]; !ok || limit.Cmp(cur) > 0 {
				seen.most[n] = limit
			}
			if holds(c, capacity.Requests[resourceapi.QualifiedName(n)]) {
				seen.heldBySome[n] = true
			} else {
				fits = false
			}
		}
		if !fits {
			continue
		}
		out.Matched[d] = true
		for _, n := range s.NodesOf(d) {
			out.Counts[n]++
		}
	}
	return out, seen
}

// why says that no selected device holds the capacity requests: it names the capacities no
// device holds; when each is held by some device, but never all of them by one, it names them all.
func (seen *capacitySeen) why(capacity *resourceapi.CapacityRequirements, names []string) string {
	short := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return seen.heldBySome[n] })
	if len(short) == 0 {
		short = names
	}
	parts := make([]string, 0, len(short))
	for _, n := range short {
		q := capacity.Requests[resourceapi.QualifiedName(n)]
		switch m, ok := seen.most[n]; {
		case !ok:
			parts = append(parts, fmt.Sprintf("%s %s requested, but none publishes a %s capacity", n, q.String(), n))
		case seen.missing[n] > 0:
			parts = append(parts, fmt.Sprintf("%s %s requested, at most %s on a device (%d publish no %s)", n, q.String(), m.String(), seen.missing[n], n))
		default:
			parts = append(parts, fmt.Sprintf("%s %s requested, at most %s on a device", n, q.String(), m.String()))
		}
	}
	match := "devices match"
	if seen.selected == 1 {
		match = "device matches"
	}
	return fmt.Sprintf("%d published %s its class and selectors, but none can hold its capacity requests: %s; request at most what a device offers",
		seen.selected, match, strings.Join(parts, "; "))
}

type capacityMatches struct {
	dm  *Matches
	why string
}

// capacityLimit is the most one allocation may set aside of c: its value, or its policy's
// maximum when lower.
func capacityLimit(c resourceapi.DeviceCapacity) resource.Quantity {
	limit := c.Value.DeepCopy()
	p := c.RequestPolicy
	switch {
	case p == nil:
	case p.ValidRange != nil && p.ValidRange.Max != nil && p.ValidRange.Max.Cmp(limit) < 0:
		limit = p.ValidRange.Max.DeepCopy()
	case len(p.ValidValues) > 0 && p.ValidValues[len(p.ValidValues)-1].Cmp(limit) < 0:
		limit = p.ValidValues[len(p.ValidValues)-1].DeepCopy()
	}
	return limit
}

// holds: an otherwise unallocated device with capacity c could give want of it. The amount set
// aside is want rounded up to the policy's next valid value (min plus a multiple of step, or the
// next of validValues); it must be a valid value and at most the capacity.
func holds(c resourceapi.DeviceCapacity, want resource.Quantity) bool {
	set := want.DeepCopy()
	if p := c.RequestPolicy; p != nil {
		switch {
		case p.ValidRange != nil && p.ValidRange.Min != nil:
			set = roundUp(want, *p.ValidRange.Min, p.ValidRange.Step)
			if p.ValidRange.Max != nil && set.Cmp(*p.ValidRange.Max) > 0 {
				return false
			}
		case len(p.ValidValues) > 0:
			i := slices.IndexFunc(p.ValidValues, func(v resource.Quantity) bool { return want.Cmp(v) <= 0 })
			if i < 0 {
				return false
			}
			set = p.ValidValues[i].DeepCopy()
		}
	}
	return set.Cmp(c.Value) <= 0
}

// roundUp is want raised to min, then up to min plus a whole number of steps, in milli-units so
// that fractional quantities round right; amounts past what milli-units hold are left as they
// are (they exceed every capacity anyway).
func roundUp(want, min resource.Quantity, step *resource.Quantity) resource.Quantity {
	if want.Cmp(min) <= 0 {
		return min.DeepCopy()
	}
	if step == nil || step.Sign() <= 0 {
		return want.DeepCopy()
	}
	const limit = int64(1) << 62
	if want.CmpInt64(limit/1000) > 0 || min.CmpInt64(limit/1000) > 0 || step.CmpInt64(limit/1000) > 0 {
		return want.DeepCopy()
	}
	w, m, st := want.MilliValue(), min.MilliValue(), step.MilliValue()
	if st <= 0 {
		return want.DeepCopy()
	}
	n := (w - m + st - 1) / st
	return *resource.NewMilliQuantity(m+n*st, want.Format)
}
