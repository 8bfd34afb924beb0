// Package diagnosis answers "why does this claim (or pod) wait?": request by request and node
// group by node group, against the current allocations, it names what keeps a claim from its
// devices (a missing class, selectors nothing matches, devices held, tainted or used up) with
// the fix, or finds where the allocator places it now. kubectl dra why prints its Diagnosis; the
// webhook's claim validation warns with Held when every matching device is held. It reads the
// published state through feasibility's index.
package diagnosis

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
)

// Cause names an obstacle between a claim and its devices. The values are stable: scripts read
// them from `kubectl dra why -o json`.
type Cause string

const (
	CauseNoSuchClass     Cause = "NoSuchClass"
	CauseInvalidSelector Cause = "InvalidSelector"
	CauseNoMatch         Cause = "NoMatchingDevice"
	CauseTooFew          Cause = "TooFewDevices"
	CauseAllocated       Cause = "DevicesAllocated"
	CauseTainted         Cause = "DevicesTainted"
	CauseCounters        Cause = "CountersExhausted"
	CauseCapacity        Cause = "CapacityExhausted"
	CauseConstraint      Cause = "ConstraintUnsatisfiable"
	CauseConflict        Cause = "RequestsConflict"
	CauseAllocatable     Cause = "Allocatable"
	CauseUnknown         Cause = "Unknown"
)

const (
	// diagnoseTimeout bounds the allocator runs of one Diagnose: a person waits for the answer,
	// not an API server, so it may take longer than searchTimeout, but not forever.
	diagnoseTimeout = 5 * time.Second
	// maxDiagnoseShapes bounds the nodes of distinct shape the allocator is tried on.
	maxDiagnoseShapes = 256
	// maxListed bounds the holders, taints and devices a finding names.
	maxListed = 10
)

// Diagnosis says why a claim has no devices, request by request and node group by node group,
// against the current allocations; or that it could have them now.
type Diagnosis struct {
	// Allocatable: the allocator finds devices for the whole claim now, on Node.
	Allocatable bool               `json:"allocatable"`
	Node        string             `json:"node,omitempty"`
	Requests    []RequestDiagnosis `json:"requests"`
	// Findings are about the claim as a whole: its constraints, requests that fit only one by
	// one, or where it fits.
	Findings []Finding `json:"findings,omitempty"`
}

// RequestDiagnosis is one request, or one firstAvailable subrequest ("request/sub").
type RequestDiagnosis struct {
	Name           string                           `json:"name"`
	DeviceClass    string                           `json:"deviceClassName"`
	AllocationMode resourceapi.DeviceAllocationMode `json:"allocationMode"`
	Count          int64                            `json:"count,omitempty"`
	// Fits: some node has enough available devices for this request alone.
	Fits     bool        `json:"fits"`
	Findings []Finding   `json:"findings,omitempty"`
	Nodes    []NodeGroup `json:"nodes,omitempty"`
}

// Finding is one obstacle, or the answer that there is none.
type Finding struct {
	Cause   Cause    `json:"cause"`
	Message string   `json:"message"`
	Details []string `json:"details,omitempty"`
	Fix     string   `json:"fix,omitempty"`
}

// NodeGroup are nodes on which a request meets the same numbers: devices that match it, and of
// those the ones held, tainted, blocked by counters or short of capacity, and the rest available.
type NodeGroup struct {
	Nodes         []string `json:"nodes"`
	Matching      int      `json:"matching"`
	Allocated     int      `json:"allocated,omitempty"`
	Tainted       int      `json:"tainted,omitempty"`
	CountersShort int      `json:"countersShort,omitempty"`
	CapacityShort int      `json:"capacityShort,omitempty"`
	Available     int      `json:"available"`
	// Holders are the claims holding the matching devices (at most maxListed).
	Holders []string `json:"holders,omitempty"`
}

// obstacle is what keeps one matching device from one request.
type obstacle uint8

const (
	obstacleNone obstacle = iota
	obstacleAllocated
	obstacleTainted
	obstacleCounters
	obstacleCapacity
	numObstacles
)

// diagnoser holds one Diagnose's state.
type diagnoser struct {
	v         *feasibility.View
	s         *feasibility.Snapshot
	fl        *deviceusage.Fleet
	namespace string
	spec      *resourceapi.ResourceClaimSpec
	// devices are the fleet's devices by snapshot index.
	devices fleetIndex
	// features are what the allocator runs with.
	features structured.Features
}

// judged is a request whose devices could be counted, with the counts.
type judged struct {
	*feasibility.Request
	alt *feasibility.Alternative
	// obstacles[d] for every matching device d.
	obstacles map[int]obstacle
	// perNode[o][n] counts the matching devices on node n with obstacle o.
	perNode [numObstacles][]int
	diag    *RequestDiagnosis
}

// Diagnose explains why the allocator cannot allocate a claim with spec now (spec defaulted as
// the API server does) or finds the node where it can. Unlike v.Unsatisfiable it counts the
// cluster's current allocations, from fl, which must have been built from the same slices the
// view lists (deviceusage.Fleet.Slices: with the DeviceTaintRules' taints, as the scheduler sees them).
// A spec the API server refuses gets an error: the allocator assumes a validated claim (see
// feasibility.WellFormed), and a --cluster-state file is not validated by anyone.
func Diagnose(ctx context.Context, v *feasibility.View, namespace string, spec *resourceapi.ResourceClaimSpec, fl *deviceusage.Fleet) (*Diagnosis, error) {
	if err := feasibility.WellFormed(spec); err != nil {
		return nil, fmt.Errorf("a claim spec the API server refuses: %w", err)
	}
	s, err := v.Snapshot()
	if err != nil {
		return nil, err
	}
	diag, err := newDiagnoser(ctx, v, s, namespace, spec, fl, indexFleet(s, fl)).run(ctx)
	if err != nil || diag.Allocatable || !waitsForOthers(diag) {
		return diag, err
	}
	// Devices held by others hide what would stop the claim once they are free: ask again with
	// every device free, and add what the claim itself cannot do (its constraints, requests that
	// only fit one by one), so nobody waits for nothing.
	freeFleet := deviceusage.Build(deviceusage.Input{Slices: fl.Slices, BusyPoolsOnly: true})
	free, err := newDiagnoser(ctx, v, s, namespace, spec, freeFleet, indexFleet(s, freeFleet)).run(ctx)
	if err != nil {
		return nil, err
	}
	for _, f := range free.Findings {
		if f.Cause == CauseConstraint || f.Cause == CauseConflict {
			f.Message = "even with every device free, " + f.Message
			diag.Findings = append(diag.Findings, f)
		}
	}
	return diag, nil
}

func newDiagnoser(ctx context.Context, v *feasibility.View, s *feasibility.Snapshot, namespace string, spec *resourceapi.ResourceClaimSpec, fl *deviceusage.Fleet, devices fleetIndex) *diagnoser {
	return &diagnoser{v: v, s: s, fl: fl, namespace: namespace, spec: spec, devices: devices, features: v.Features(ctx, s)}
}

func (d *diagnoser) run(ctx context.Context) (*Diagnosis, error) {
	diag := &Diagnosis{Requests: []RequestDiagnosis{}}
	var all []*judged
	complete := true
	for _, r := range feasibility.Requests(d.spec) {
		j := d.judge(ctx, r)
		diag.Requests = append(diag.Requests, *j.diag)
		if j.alt == nil {
			complete = false
			continue
		}
		all = append(all, j)
	}
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	if complete {
		d.judgeClaim(ctx, diag, all)
	}
	return diag, nil
}

// waitsForOthers: some request is short of devices because other claims use them.
func waitsForOthers(diag *Diagnosis) bool {
	for _, r := range diag.Requests {
		for _, f := range r.Findings {
			if f.Cause == CauseAllocated || f.Cause == CauseCounters || f.Cause == CauseCapacity {
				return true
			}
		}
	}
	return false
}

// judge counts the request's devices node by node and names its obstacles.
func (d *diagnoser) judge(ctx context.Context, r *feasibility.Request) *judged {
	j := &judged{Request: r, diag: &RequestDiagnosis{Name: r.Name, DeviceClass: r.Class, AllocationMode: r.Mode}}
	if r.Mode != resourceapi.DeviceAllocationModeAll {
		j.diag.Count = r.Count
	}
	class := d.s.Class(r.Class)
	if class == nil {
		j.diag.Findings = append(j.diag.Findings, d.noSuchClass(r.Class))
		return j
	}
	if f, bad := d.invalidSelectors(class, r); bad {
		j.diag.Findings = append(j.diag.Findings, f...)
		return j
	}
	alt, ok := d.v.MatchRequest(ctx, d.s, r)
	if !ok {
		return j
	}
	j.alt = alt
	dm, short := alt.Matches, alt.CapacityShort
	j.obstacles = map[int]obstacle{}
	for o := range j.perNode {
		j.perNode[o] = make([]int, d.s.NumNodes())
	}
	matched := 0
	for di, m := range dm.Matched {
		if !m {
			continue
		}
		matched++
		o := d.obstacleOf(di, r)
		j.obstacles[di] = o
		for _, n := range d.s.NodesOf(di) {
			j.perNode[o][n]++
		}
	}
	j.diag.Nodes = d.nodeGroups(j)
	if matched == 0 && short != "" {
		j.diag.Findings = append(j.diag.Findings, Finding{Cause: CauseNoMatch, Message: short,
			Fix: "request less capacity, or add devices with more of it"})
		return j
	}
	if matched == 0 {
		j.diag.Findings = append(j.diag.Findings, d.noMatch(ctx, class, r))
		return j
	}
	best := 0
	for n := range d.s.NumNodes() {
		if dm.Counts[n] > dm.Counts[best] {
			best = n
		}
	}
	if j.alt.Wanted > int64(dm.Counts[best]) {
		j.diag.Findings = append(j.diag.Findings, Finding{Cause: CauseTooFew,
			Message: fmt.Sprintf("%d wanted, best node %s has %d matching", r.Count, d.s.NodeName(best), dm.Counts[best]),
			Fix:     fmt.Sprintf("request at most %d, or split the work across several claims", dm.Counts[best])})
		return j
	}
	for n := range d.s.NumNodes() {
		if j.fits(n) {
			j.diag.Fits = true
			return j
		}
	}
	j.diag.Findings = append(j.diag.Findings, d.obstacles(j)...)
	return j
}

func (j *judged) available(n int) int { return j.perNode[obstacleNone][n] }

// fits: the request alone could have its devices on node n now.
func (j *judged) fits(n int) bool {
	if j.alt.Wanted < 0 {
		return j.alt.Counts[n] > 0 && j.available(n) == j.alt.Counts[n]
	}
	return int64(j.available(n)) >= j.alt.Wanted
}

// enough: node n has enough matching devices, taken or not.
func (j *judged) enough(n int) bool {
	if j.alt.Wanted < 0 {
		return j.alt.Counts[n] > 0
	}
	return int64(j.alt.Counts[n]) >= j.alt.Wanted
}

// obstacleOf says what keeps device di from request r, in the order the allocator checks.
func (d *diagnoser) obstacleOf(di int, r *feasibility.Request) obstacle {
	dev := d.devices.of(di)
	if dev == nil {
		return obstacleNone
	}
	if !r.AdminAccess && !dev.Shared && len(dev.Holders()) > 0 {
		return obstacleAllocated
	}
	if len(untolerated(dev, r)) > 0 {
		return obstacleTainted
	}
	if len(dev.CountersShort) > 0 {
		return obstacleCounters
	}
	if dev.Shared && !capacityLeft(dev, r) {
		return obstacleCapacity
	}
	return obstacleNone
}

// capacityLeft: a shared device has what the request would consume of each capacity: what it
// asks for, else the device's default for requests, else all of it (KEP-5075).
func capacityLeft(dev *deviceusage.Device, r *feasibility.Request) bool {
	for name, c := range dev.Published().Capacity {
		var want = c.Value
		switch {
		case r.Capacity != nil && hasKey(r.Capacity.Requests, name):
			want = r.Capacity.Requests[name]
		case c.RequestPolicy != nil && c.RequestPolicy.Default != nil:
			want = *c.RequestPolicy.Default
		}
		left := c.Value.DeepCopy()
		if used, ok := dev.Consumed[name]; ok {
			left.Sub(used)
		}
		if left.Cmp(want) < 0 {
			return false
		}
	}
	return true
}

func hasKey[K comparable, V any](m map[K]V, k K) bool {
	_, ok := m[k]
	return ok
}

// nodeGroups groups the nodes by their counts for the request, most available first.
func (d *diagnoser) nodeGroups(j *judged) []NodeGroup {
	byKey := map[[numObstacles + 1]int]*NodeGroup{}
	var groups []*NodeGroup
	for n := range d.s.NumNodes() {
		var k [numObstacles + 1]int
		k[0] = j.alt.Counts[n]
		for o := range numObstacles {
			k[o+1] = j.perNode[o][n]
		}
		g := byKey[k]
		if g == nil {
			g = &NodeGroup{Matching: k[0], Available: k[1+obstacleNone], Allocated: k[1+obstacleAllocated], Tainted: k[1+obstacleTainted],
				CountersShort: k[1+obstacleCounters], CapacityShort: k[1+obstacleCapacity]}
			byKey[k] = g
			groups = append(groups, g)
		}
		g.Nodes = append(g.Nodes, d.s.NodeName(n))
	}
	for _, g := range groups {
		if g.Allocated > 0 {
			g.Holders = d.holdersOn(j, g.Nodes)
		}
	}
	slices.SortStableFunc(groups, func(a, b *NodeGroup) int {
		return cmp.Or(-cmp.Compare(a.Available, b.Available), -cmp.Compare(a.Matching, b.Matching), cmp.Compare(a.Nodes[0], b.Nodes[0]))
	})
	out := make([]NodeGroup, 0, len(groups))
	for _, g := range groups {
		out = append(out, *g)
	}
	return out
}

// holdersOn names the claims (and pods) holding the request's matching devices on nodes.
func (d *diagnoser) holdersOn(j *judged, nodes []string) []string {
	on := map[int]bool{}
	for _, name := range nodes {
		n, _ := d.s.NodeIndex(name)
		on[n] = true
	}
	var out []string
	seen := map[string]bool{}
	for di, o := range sortedObstacles(j.obstacles) {
		if o != obstacleAllocated || !slices.ContainsFunc(d.s.NodesOf(di), func(n int) bool { return on[n] }) {
			continue
		}
		for _, a := range d.devices.of(di).Holders() {
			if h := a.Holder(); !seen[h] {
				seen[h] = true
				out = append(out, h)
			}
		}
		if len(out) >= maxListed {
			break
		}
	}
	return out
}

// sortedObstacles iterates a device→obstacle map in device order, so that messages are stable.
func sortedObstacles(m map[int]obstacle) func(func(int, obstacle) bool) {
	return func(yield func(int, obstacle) bool) {
		keys := make([]int, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if !yield(k, m[k]) {
				return
			}
		}
	}
}

// noSuchClass says the class is missing and which ones exist, the closest first.
func (d *diagnoser) noSuchClass(name string) Finding {
	names := d.s.ClassNames()
	f := Finding{Cause: CauseNoSuchClass, Message: fmt.Sprintf("DeviceClass %q does not exist", name)}
	switch {
	case len(names) == 0:
		f.Fix = "the cluster has no DeviceClass: install the driver that provides it"
	case closest(name, names) != "":
		f.Fix = fmt.Sprintf("did you mean %q? The cluster has %s", closest(name, names), quoteMax(names, maxListed))
	default:
		f.Fix = fmt.Sprintf("use one of %s, or create it", quoteMax(names, maxListed))
	}
	return f
}

func quoteMax(items []string, n int) string {
	q := make([]string, 0, len(items))
	for _, s := range items {
		q = append(q, fmt.Sprintf("%q", s))
	}
	return listMax(q, n)
}

func listMax(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:n], ", ") + fmt.Sprintf(" and %d more", len(items)-n)
}
