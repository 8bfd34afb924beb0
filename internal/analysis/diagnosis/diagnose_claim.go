package diagnosis

import (
	"context"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
)

// judgeClaim runs the scheduler's allocator, with the current allocations, on the nodes where
// every request fits alone; when it finds no place it tells constraints from requests that only
// fit one by one.
func (d *diagnoser) judgeClaim(ctx context.Context, diag *Diagnosis, all []*judged) {
	candidates, ok := d.fitAlone(all)
	if !ok {
		return // a request that fits nowhere: its findings say why
	}
	if len(candidates) == 0 {
		diag.Findings = append(diag.Findings, d.apart(all))
		return
	}
	// A matchAttribute constraint needs as many available devices sharing one value as its
	// requests want together; nodes without them are out before any allocator runs (with unique
	// values, such as uuid, every node has a shape of its own and the allocator would run on each).
	kept, ruledOut := d.constraintsPossible(all, candidates)
	if len(kept) == 0 {
		for ci, c := range d.spec.Devices.Constraints {
			if ruledOut[ci] == len(candidates) {
				diag.Findings = append(diag.Findings, d.constraint(ci, c, all, candidates))
			}
		}
		if len(diag.Findings) == 0 {
			diag.Findings = append(diag.Findings, constraintsTogether())
		}
		return
	}
	candidates = kept
	ctx, cancel := context.WithTimeout(ctx, diagnoseTimeout)
	defer cancel()
	alts := make([]*feasibility.Alternative, 0, len(all))
	for _, j := range all {
		alts = append(alts, j.alt)
	}
	node, complete, err := d.firstFit(ctx, candidates, d.spec, alts)
	switch {
	case node >= 0:
		diag.Allocatable, diag.Node = true, d.s.NodeName(node)
		diag.Findings = append(diag.Findings, Finding{Cause: CauseAllocatable,
			Message: fmt.Sprintf("the allocator finds devices for the claim now, on node %s", diag.Node),
			Fix:     "if its pod stays Pending, something other than its devices keeps it off that node (node selector, taints, CPU or memory): see the scheduler's message"})
	case err != nil:
		diag.Findings = append(diag.Findings, Finding{Cause: CauseUnknown, Message: fmt.Sprintf("the allocator fails: %v", err)})
	case !complete:
		diag.Findings = append(diag.Findings, Finding{Cause: CauseUnknown,
			Message: fmt.Sprintf("the allocator found no place on the nodes it tried and could not try them all within %s (%d nodes where each request fits alone)", diagnoseTimeout, len(candidates))})
	default:
		diag.Findings = append(diag.Findings, d.noPlace(ctx, all, candidates, alts)...)
	}
}

// fitAlone are the nodes where every request fits alone; false when some request fits on no node.
func (d *diagnoser) fitAlone(all []*judged) ([]int, bool) {
	nreq := len(d.spec.Devices.Requests)
	for ri := range nreq {
		if !slices.ContainsFunc(all, func(j *judged) bool { return j.Index == ri && j.diag.Fits }) {
			return nil, false
		}
	}
	var candidates []int
	for n := range d.s.NumNodes() {
		ok := true
		for ri := range nreq {
			if !slices.ContainsFunc(all, func(j *judged) bool { return j.Index == ri && j.fits(n) }) {
				ok = false
				break
			}
		}
		if ok {
			candidates = append(candidates, n)
		}
	}
	return candidates, true
}

// noPlace explains why the allocator places the claim on none of the candidate nodes, where each
// request fits alone: the constraints that cannot hold, or requests competing for the devices.
func (d *diagnoser) noPlace(ctx context.Context, all []*judged, candidates []int, alts []*feasibility.Alternative) []Finding {
	if len(d.spec.Devices.Constraints) > 0 {
		unconstrained := d.spec.DeepCopy()
		unconstrained.Devices.Constraints = nil
		if n, _, _ := d.firstFit(ctx, candidates, unconstrained, alts); n >= 0 {
			var out []Finding
			for ci, c := range d.spec.Devices.Constraints {
				one := d.spec.DeepCopy()
				one.Devices.Constraints = []resourceapi.DeviceConstraint{c}
				if n, complete, _ := d.firstFit(ctx, candidates, one, alts); n < 0 && complete {
					out = append(out, d.constraint(ci, c, all, candidates))
				}
			}
			if len(out) == 0 {
				out = append(out, constraintsTogether())
			}
			return out
		}
	}
	return []Finding{d.conflict(all, candidates)}
}

func constraintsTogether() Finding {
	return Finding{Cause: CauseConstraint, Message: "each of the claim's constraints can hold alone, but not all of them at once on any node",
		Fix: "drop one of the constraints or ask for fewer devices"}
}

// constraintsPossible keeps the candidate nodes where every matchAttribute constraint has enough
// available devices with one value for the requests it names; ruledOut counts, per constraint,
// the nodes it excludes. A shared device may serve several requests at once, so constraints over
// requests that match one are not judged here.
func (d *diagnoser) constraintsPossible(all []*judged, candidates []int) ([]int, map[int]int) {
	ruledOut := map[int]int{}
	type check struct {
		ci           int
		domain, name string
		sub          []*judged
		union        []bool
	}
	var checks []check
	for ci, c := range d.spec.Devices.Constraints {
		if c.MatchAttribute == nil {
			continue
		}
		sub := d.involved(c, all)
		union := d.unionMatched(sub)
		if d.anyShared(union) {
			continue
		}
		domain, name := feasibility.SplitQualified(string(*c.MatchAttribute))
		checks = append(checks, check{ci, domain, name, sub, union})
	}
	var kept []int
	for _, n := range candidates {
		ok := true
		for _, c := range checks {
			group := 0
			for _, k := range d.valueGroups(c.sub, c.union, n, c.domain, c.name) {
				group = max(group, k)
			}
			if int64(group) < d.need(c.sub, n) {
				ruledOut[c.ci]++
				ok = false
			}
		}
		if ok {
			kept = append(kept, n)
		}
	}
	return kept, ruledOut
}

func (d *diagnoser) anyShared(matched []bool) bool {
	for di, m := range matched {
		if m && d.devices.of(di) != nil && d.devices.of(di).Shared {
			return true
		}
	}
	return false
}

// involved are the judged requests a constraint names (all of them when it names none).
func (d *diagnoser) involved(c resourceapi.DeviceConstraint, all []*judged) []*judged {
	names := requestNames(d.spec, c.Requests)
	var sub []*judged
	for _, j := range all {
		if slices.ContainsFunc(names, func(n string) bool { return n == j.Name || n == resourceclaim.BaseRequestRef(j.Name) }) {
			sub = append(sub, j)
		}
	}
	return sub
}

// need is how many devices the requests of sub want together on node n, each at its fewest.
func (d *diagnoser) need(sub []*judged, n int) int64 {
	var total int64
	seen := map[int]bool{}
	for _, j := range sub {
		if seen[j.Index] {
			continue
		}
		seen[j.Index] = true
		total += max(wanted(sub, j.Index, n), 0)
	}
	return total
}

// valueGroups counts the available devices on node n that requests of sub match, by their value
// of the attribute domain/name; devices without it are left out.
func (d *diagnoser) valueGroups(sub []*judged, union []bool, n int, domain, name string) map[string]int {
	values := map[string]int{}
	for di, m := range union {
		if !m || !d.availableOn(sub, di, n) {
			continue
		}
		if v, ok := d.s.Attribute(di, domain, name); ok {
			values[v]++
		}
	}
	return values
}

// firstFit tries the allocator, with the current allocations, on one node of each shape among
// candidates; it returns the first node where spec fits (-1: none) and whether every shape was
// tried.
func (d *diagnoser) firstFit(ctx context.Context, candidates []int, spec *resourceapi.ResourceClaimSpec, alts []*feasibility.Alternative) (int, bool, error) {
	features := d.features
	state := d.fl.AllocatedState()
	tried := map[string]bool{}
	for _, n := range candidates {
		key := d.s.ShapeKey(n, spec, alts, d.useKey)
		if tried[key] {
			continue
		}
		if len(tried) == maxDiagnoseShapes {
			klog.FromContext(ctx).V(2).Info("Diagnosis gave up: too many distinct node shapes", "shapes", maxDiagnoseShapes)
			return -1, false, nil
		}
		tried[key] = true
		ok, err := d.v.Allocate(ctx, d.s, n, d.namespace, spec, features, state)
		if ok {
			return n, true, nil
		}
		if ctx.Err() != nil {
			return -1, false, nil
		}
		if err != nil {
			return -1, true, err
		}
	}
	return -1, true, nil
}

// useKey tells devices apart by their current use, which the allocator sees through the state.
func (d *diagnoser) useKey(di int) string {
	dev := d.devices.of(di)
	if dev == nil {
		// Not in a fleet of busy pools: as free as a free device.
		return string(deviceusage.StateFree)
	}
	var b strings.Builder
	b.WriteString(string(dev.State))
	for n, q := range dev.Consumed {
		b.WriteString("\x00" + string(n) + "=" + q.String())
	}
	return b.String()
}

// wanted is the fewest devices a request needs on a node: its smallest alternative that fits.
func wanted(all []*judged, ri int, n int) int64 {
	best := int64(-1)
	for _, j := range all {
		if j.Index != ri || !j.fits(n) {
			continue
		}
		w := j.alt.Wanted
		if w < 0 {
			w = int64(j.alt.Counts[n])
		}
		if best < 0 || w < best {
			best = w
		}
	}
	return best
}

func requestNames(spec *resourceapi.ResourceClaimSpec, only []string) []string {
	if len(only) > 0 {
		return only
	}
	names := make([]string, 0, len(spec.Devices.Requests))
	for _, r := range spec.Devices.Requests {
		names = append(names, r.Name)
	}
	return names
}

// apart: every request fits on some node, never all of them on the same one.
func (d *diagnoser) apart(all []*judged) Finding {
	var parts []string
	for ri, r := range d.spec.Devices.Requests {
		var nodes []string
		for n := range d.s.NumNodes() {
			if slices.ContainsFunc(all, func(j *judged) bool { return j.Index == ri && j.fits(n) }) {
				nodes = append(nodes, d.s.NodeName(n))
			}
		}
		parts = append(parts, fmt.Sprintf("%s fits on %s", r.Name, listMax(nodes, 3)))
	}
	return Finding{Cause: CauseConflict, Message: "each request fits on some node, but no node has devices for all of them at once",
		Details: parts, Fix: "split the claim so that each part fits on one node, or ask for fewer devices"}
}

// conflict: all requests fit on the candidate nodes one by one but compete for the same devices.
func (d *diagnoser) conflict(all []*judged, candidates []int) Finding {
	best, bestAvail, need := -1, -1, int64(0)
	union := d.unionMatched(all)
	for _, n := range candidates {
		avail := 0
		for di, m := range union {
			if m && d.availableOn(all, di, n) {
				avail++
			}
		}
		if avail > bestAvail {
			best, bestAvail = n, avail
		}
	}
	for ri := range d.spec.Devices.Requests {
		need += wanted(all, ri, best)
	}
	names := requestNames(d.spec, nil)
	return Finding{Cause: CauseConflict,
		Message: fmt.Sprintf("requests %s each fit alone but not together: together they need %d devices, best node %s has %d available that match any of them",
			strings.Join(names, ", "), need, d.s.NodeName(best), bestAvail),
		Fix: "request fewer devices, or split the claim"}
}

// unionMatched marks the devices any request matches.
func (d *diagnoser) unionMatched(all []*judged) []bool {
	out := make([]bool, d.s.NumDevices())
	for _, j := range all {
		for di, m := range j.alt.Matched {
			out[di] = out[di] || m
		}
	}
	return out
}

// availableOn: device di is on node n and free for at least one request that matches it.
func (d *diagnoser) availableOn(all []*judged, di, n int) bool {
	if !slices.Contains(d.s.NodesOf(di), n) {
		return false
	}
	for _, j := range all {
		if o, ok := j.obstacles[di]; ok && o == obstacleNone {
			return true
		}
	}
	return false
}

// constraint explains a matchAttribute constraint that no candidate node can satisfy: how many
// available devices share one value, against how many the requests need, and which attributes
// enough of them do share.
func (d *diagnoser) constraint(ci int, c resourceapi.DeviceConstraint, all []*judged, candidates []int) Finding {
	names := requestNames(d.spec, c.Requests)
	sub := d.involved(c, all)
	f := Finding{Cause: CauseConstraint, Fix: "drop the constraint or ask for fewer devices"}
	if c.MatchAttribute == nil {
		f.Message = fmt.Sprintf("constraint %d (requests %s) cannot hold on any node", ci, strings.Join(names, ", "))
		return f
	}
	attr := string(*c.MatchAttribute)
	domain, name := feasibility.SplitQualified(attr)
	best, bestGroup := candidates[0], -1
	var bestValues map[string]int
	union := d.unionMatched(sub)
	for _, n := range candidates {
		values := d.valueGroups(sub, union, n, domain, name)
		group := 0
		for _, k := range values {
			group = max(group, k)
		}
		if group > bestGroup {
			best, bestGroup, bestValues = n, group, values
		}
	}
	need := d.need(sub, best)
	node := d.s.NodeName(best)
	f.Message = fmt.Sprintf("constraint matchAttribute %s over requests %s cannot hold: together they need %d devices with the same %s, but no node has more than %s with one value (best node %s: %s)",
		attr, strings.Join(names, ", "), need, name, plural(bestGroup, "available matching device"), node, plural(len(bestValues), "value"))
	if int64(bestGroup) >= need {
		f.Message = fmt.Sprintf("constraint matchAttribute %s over requests %s cannot hold: on node %s, the devices that share a value of %s do not match the requests that need them",
			attr, strings.Join(names, ", "), node, name)
	}
	if shared := d.sharedAttributes(sub, best, need, attr); len(shared) > 0 {
		f.Fix = "drop the constraint, or match an attribute enough of these devices share: " + strings.Join(shared, ", ")
	}
	return f
}

// sharedAttributes lists the attributes (but skip) of which at least need available devices on
// node n have one common value.
func (d *diagnoser) sharedAttributes(sub []*judged, n int, need int64, skip string) []string {
	groups := map[string]map[string]int{}
	for di, m := range d.unionMatched(sub) {
		if !m || !d.availableOn(sub, di, n) {
			continue
		}
		d.s.RangeAttributes(di, func(full, value string) {
			if groups[full] == nil {
				groups[full] = map[string]int{}
			}
			groups[full][value]++
		})
	}
	var out []string
	for name, values := range groups {
		if name == skip {
			continue
		}
		for _, k := range values {
			if int64(k) >= need {
				out = append(out, name)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}
