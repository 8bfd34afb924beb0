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
	key := "capacity\x00" + string(h.Sum(nil))
	if cached, ok := s.matchResults.Get(key); ok {
		c := cached.(*capacityMatches)
		return c.dm, c.why
	}
	out := &Matches{Counts: make([]int, len(s.nodes)), Matched: make([]bool, len(s.devices))}
	selected := 0
	// most is, per requested capacity, the largest amount a selected device could set aside.
	most := map[string]resource.Quantity{}
	missing := map[string]int{}
	// heldBySome: some selected device could hold the request's amount of this capacity.
	heldBySome := map[string]bool{}
	for d, m := range dm.Matched {
		if !m {
			continue
		}
		selected++
		caps := s.dev(d).published().Capacity
		fits := true
		for _, n := range names {
			c, ok := caps[resourceapi.QualifiedName(n)]
			if !ok {
				missing[n]++
				fits = false
				continue
			}
			limit := capacityLimit(c)
			if cur, ok := most[n]; !ok || limit.Cmp(cur) > 0 {
				most[n] = limit
			}
			if holds(c, capacity.Requests[resourceapi.QualifiedName(n)]) {
				heldBySome[n] = true
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
	why := ""
	if selected > 0 && out.Count() == 0 {
		// Name the capacities no device holds; when each is held by some device, but never all of
		// them by one, name them all.
		short := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return heldBySome[n] })
		if len(short) == 0 {
			short = names
		}
		parts := make([]string, 0, len(short))
		for _, n := range short {
			q := capacity.Requests[resourceapi.QualifiedName(n)]
			switch m, ok := most[n]; {
			case !ok:
				parts = append(parts, fmt.Sprintf("%s %s requested, but none publishes a %s capacity", n, q.String(), n))
			case missing[n] > 0:
				parts = append(parts, fmt.Sprintf("%s %s requested, at most %s on a device (%d publish no %s)", n, q.String(), m.String(), missing[n], n))
			default:
				parts = append(parts, fmt.Sprintf("%s %s requested, at most %s on a device", n, q.String(), m.String()))
			}
		}
		match := "devices match"
		if selected == 1 {
			match = "device matches"
		}
		why = fmt.Sprintf("%d published %s its class and selectors, but none can hold its capacity requests: %s; request at most what a device offers",
			selected, match, strings.Join(parts, "; "))
	}
	s.matchResults.Add(key, &capacityMatches{dm: out, why: why})
	return out, why
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
