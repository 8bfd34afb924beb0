package feasibility

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
)

// maxShapes bounds the allocator runs per question. Past it the answer is "maybe", never a
// warning: a false alarm is worse than a missed one.
const maxShapes = 32

// Alternative is one way to satisfy a request: the request itself or one firstAvailable
// subrequest, with the devices that could serve it.
type Alternative struct {
	// Request is the index of the request in the claim.
	Request int
	Name    string
	Wanted  int64 // -1: allocationMode All
	*Matches
	// CapacityShort, when set, says why no device its selectors accept could ever hold its
	// capacity requests.
	CapacityShort string
}

// Unsatisfiable runs the scheduler's allocator against the published devices, ignoring current
// allocations, and explains why no node can satisfy spec, or returns "" when some node can (or
// when the answer is unknown, e.g. a class is missing or the question is too big to answer fast).
func (v *View) Unsatisfiable(ctx context.Context, namespace string, spec *resourceapi.ResourceClaimSpec) (string, error) {
	s, err := v.Snapshot()
	if err != nil {
		return "", err
	}
	if len(spec.Devices.Requests) == 0 {
		return "", nil
	}
	if err := WellFormed(spec); err != nil {
		klog.FromContext(ctx).V(2).Info("Feasibility check skipped: malformed claim", "err", err)
		return "", nil
	}
	features := v.Features(ctx, s)
	// One search a question for every review asking it meanwhile (package answers). Nothing
	// learnt under an ended context is a verdict: an interrupted evaluation looks exactly like
	// one that found no device, and is neither remembered nor, past the review's own deadline,
	// waited for ("": unknown).
	msg, _ := s.verdicts.Find(ctx, QuestionKey(namespace, features, spec), v.timeout, func(ctx context.Context) (string, bool) {
		return v.unsatisfiable(ctx, s, namespace, spec, features)
	})
	return msg, nil
}

// QuestionKey is the digest answers are remembered by: a key is then 32 bytes however large the
// claim, and a cached answer keeps nothing of it. The features are part of the question: the API
// server's answer may change within one published state. Nil when spec cannot be encoded.
func QuestionKey(namespace string, features structured.Features, spec *resourceapi.ResourceClaimSpec) *[sha256.Size]byte {
	data, err := json.Marshal(spec)
	if err != nil {
		return nil
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%+v\x00", namespace, features)
	h.Write(data)
	return (*[sha256.Size]byte)(h.Sum(nil))
}

// unsatisfiable answers for one snapshot; cacheable is false for answers that depend on more
// than the snapshot and the spec (allocator errors).
func (v *View) unsatisfiable(ctx context.Context, s *Snapshot, namespace string, spec *resourceapi.ResourceClaimSpec, features structured.Features) (string, bool) {
	logger := klog.FromContext(ctx)
	var alts []*Alternative
	for _, r := range Requests(spec) {
		if r.Capacity != nil && len(r.Capacity.Requests) > 0 && !features.ConsumableCapacity {
			// The API server drops capacity requests where it does not serve them, so only a
			// claim that never reaches it (kubectl dra validate) gets here.
			return fmt.Sprintf("request %s asks for capacity, but the cluster does not serve consumable capacity (feature gate DRAConsumableCapacity, on by default from Kubernetes 1.36): the API server drops capacity requests; select devices by their capacity instead", r.Name), true
		}
		a, ok := v.MatchRequest(ctx, s, r)
		if !ok {
			return "", true
		}
		alts = append(alts, a)
	}

	if ctx.Err() != nil {
		logger.V(2).Info("Feasibility check ran out of time matching devices; no verdict", "err", context.Cause(ctx))
		return "", false
	}
	candidates := candidateNodes(s, spec, alts)
	tried := map[string]bool{}
	var lastErr error
	for _, n := range candidates {
		shape := s.shapeKey(n, spec, alts)
		if tried[shape] {
			continue
		}
		if len(tried) == maxShapes {
			logger.V(4).Info("Feasibility check gave up: too many distinct node shapes", "shapes", maxShapes)
			return "", true
		}
		tried[shape] = true
		ok, err := v.allocate(ctx, s, n, namespace, spec, features)
		if ok {
			return "", true
		}
		if ctx.Err() != nil {
			logger.V(2).Info("Feasibility check ran out of time; no verdict", "shapesTried", len(tried), "err", context.Cause(ctx))
			return "", false
		}
		if err != nil {
			lastErr = err
		}
	}
	if msg := v.onlyTainted(ctx, s, namespace, spec, candidates); msg != "" {
		return msg, ctx.Err() == nil
	}
	msg := explain(s, spec, alts, candidates)
	if lastErr != nil {
		return msg + fmt.Sprintf(" (allocator: %v)", lastErr), false
	}
	return msg, true
}

// MatchRequest counts per node the devices that the class and the selectors accept and
// that could hold the request's capacity requests; false when the class is missing or a
// selector does not compile.
func (v *View) MatchRequest(ctx context.Context, s *Snapshot, r *Request) (*Alternative, bool) {
	class := s.classes[r.Class]
	if class == nil {
		return nil, false
	}
	dm, ok := v.Match(ctx, s, append(ClassExprs(class), selectorExprs(r.Selectors)...))
	if !ok {
		return nil, false
	}
	alt := &Alternative{Request: r.Index, Name: r.Name, Wanted: r.Count}
	if r.Mode == resourceapi.DeviceAllocationModeAll {
		alt.Wanted = -1
	}
	alt.Matches, alt.CapacityShort = s.withCapacity(dm, r.Capacity)
	return alt, true
}

// Matches is which devices (by snapshot index) a list of selectors accepts, and how many per
// node. It depends only on the snapshot and the selectors, so it is computed once per snapshot.
type Matches struct {
	Counts  []int
	Matched []bool
}

// Count is the number of devices matched.
func (m *Matches) Count() int {
	n := 0
	for _, ok := range m.Matched {
		if ok {
			n++
		}
	}
	return n
}

func (v *View) matchAll(ctx context.Context, s *Snapshot, exprs []string, refs []celcheck.Ref, opaque bool) *Matches {
	// Keyed by a digest, as verdicts are: the selectors can be up to 10 KB each.
	h := sha256.New()
	for _, e := range exprs {
		h.Write([]byte(e))
		h.Write([]byte{0, 0})
	}
	h.Write([]byte{0, 1})
	h.Write([]byte(refsKey(refs, opaque)))
	exprKey := string(h.Sum(nil))
	if dm, ok := s.matchResults.Get(exprKey); ok {
		return dm.(*Matches)
	}
	dm := &Matches{Counts: make([]int, len(s.nodes)), Matched: make([]bool, len(s.devices))}
	p := s.projectionFor(refs, opaque)
	for g, key := range p.order {
		members := p.members.of(g)
		if !v.matchesGroup(ctx, exprKey+key, exprs, s.dev(int(members[0]))) {
			continue
		}
		for _, d := range members {
			dm.Matched[d] = true
			for _, n := range s.NodesOf(int(d)) {
				dm.Counts[n]++
			}
		}
	}
	if ctx.Err() == nil { // else some groups were not evaluated, only interrupted
		s.matchResults.Add(exprKey, dm)
	}
	return dm
}

func dedupRefs(refs []celcheck.Ref) []celcheck.Ref {
	seen := map[celcheck.Ref]bool{}
	out := refs[:0:0]
	for _, r := range refs {
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return fmt.Sprint(out[i]) < fmt.Sprint(out[j])
	})
	return out
}

// matchesGroup evaluates the selectors once for a group of devices whose read values are equal.
func (v *View) matchesGroup(ctx context.Context, key string, exprs []string, d devRef) bool {
	v.matchMu.RLock()
	ok, found := v.matches[key]
	v.matchMu.RUnlock()
	if found {
		return ok
	}
	ok = true
	for _, e := range exprs {
		res := v.celCache.GetOrCompile(e)
		if res.Error != nil {
			ok = false
			break
		}
		m, _, err := res.DeviceMatches(ctx, d.celInput())
		if err != nil || !m {
			// The allocator reports a runtime error for the whole claim; for counting, such a
			// device simply does not match.
			ok = false
			break
		}
	}
	if ctx.Err() != nil {
		// The evaluation may have been interrupted: its "no" is not the selectors' answer, and
		// this cache outlives Invalidate.
		return false
	}
	v.matchMu.Lock()
	if len(v.matches) > maxMatches {
		v.matches = map[string]bool{}
	}
	v.matches[key] = ok
	v.matchMu.Unlock()
	return ok
}

func (a *Alternative) fits(node int) bool {
	if a.Wanted < 0 {
		return a.Counts[node] > 0
	}
	return int64(a.Counts[node]) >= a.Wanted
}

// candidateNodes are the nodes where every request has an alternative with enough matching devices.
func candidateNodes(s *Snapshot, spec *resourceapi.ResourceClaimSpec, alts []*Alternative) []int {
	var out []int
	for n := range s.nodes {
		ok := true
		for ri := range spec.Devices.Requests {
			any := false
			for _, a := range alts {
				if a.Request == ri && a.fits(n) {
					any = true
					break
				}
			}
			if !any {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, n)
		}
	}
	return out
}

// shapeKey is equal for nodes on which the allocator necessarily reaches the same verdict: the
// same multiset of devices by which alternatives they match, the values the constraints compare
// and their taints.
func (s *Snapshot) shapeKey(n int, spec *resourceapi.ResourceClaimSpec, alts []*Alternative) string {
	return s.ShapeKey(n, spec, alts, nil)
}

// ShapeKey is shapeKey with more to tell devices apart: extra(d), when set, is part of each
// device's signature (e.g. whether it is free now).
func (s *Snapshot) ShapeKey(n int, spec *resourceapi.ResourceClaimSpec, alts []*Alternative, extra func(d int) string) string {
	if s.exact {
		return s.nodes[n].Name
	}
	var sigs []string
	var b strings.Builder
	for dn := range s.NodeDevices(n) {
		d := int(dn)
		b.Reset()
		any := false
		for _, a := range alts {
			if a.Matched[d] {
				any = true
				b.WriteByte('1')
			} else {
				b.WriteByte('0')
			}
		}
		if !any {
			continue
		}
		dev := s.dev(d)
		for _, c := range spec.Devices.Constraints {
			if c.MatchAttribute == nil {
				continue
			}
			domain, name := SplitQualified(string(*c.MatchAttribute))
			val, _ := attributeValue(dev, domain, name)
			b.WriteByte(0)
			b.WriteString(val)
		}
		b.WriteByte(0)
		b.WriteString(s.taintOf(d))
		if extra != nil {
			b.WriteByte(0)
			b.WriteString(extra(d))
		}
		sigs = append(sigs, b.String())
	}
	sort.Strings(sigs)
	return strings.Join(sigs, "\x00\x02")
}

// SplitQualified splits a qualified attribute name into its domain ("" for none) and name.
func SplitQualified(q string) (string, string) {
	if i := strings.Index(q, "/"); i >= 0 {
		return q[:i], q[i+1:]
	}
	return "", q
}

func (v *View) allocate(ctx context.Context, s *Snapshot, n int, namespace string, spec *resourceapi.ResourceClaimSpec, features structured.Features) (bool, error) {
	if err := WellFormed(spec); err != nil {
		return false, err
	}
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	return v.Allocate(ctx, s, n, namespace, spec, features, state)
}

// Allocate runs the allocator on node n with the given features and allocated state.
func (v *View) Allocate(ctx context.Context, s *Snapshot, n int, namespace string, spec *resourceapi.ResourceClaimSpec, features structured.Features, state structured.AllocatedState) (bool, error) {
	alloc, err := structured.NewAllocator(ctx, features, state, classLister{s}, s.fullSlices(n), v.celCache)
	if err != nil {
		return false, fmt.Errorf("create allocator: %w", err)
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "admission-check", Namespace: namespace, UID: "admission-check"},
		Spec:       *spec,
	}
	result, err := alloc.Allocate(ctx, s.nodes[n].Full(), []*resourceapi.ResourceClaim{claim})
	if err != nil {
		return false, fmt.Errorf("node %s: %w", s.nodes[n].Name, err)
	}
	return len(result) == 1, nil
}

// fullSlices are the slices node n sees, as published: what the allocator reads.
func (s *Snapshot) fullSlices(n int) []*resourceapi.ResourceSlice {
	if out, ok := s.full.Get(n); ok {
		return out.([]*resourceapi.ResourceSlice)
	}
	slices := s.nodeSlices.of(n)
	out := make([]*resourceapi.ResourceSlice, len(slices))
	for i, si := range slices {
		out[i] = s.slices[si].Full()
	}
	s.full.Add(n, out)
	return out
}

// explain names the first request no node can satisfy, with the best node's count, or says that
// the requests only fail together.
func explain(s *Snapshot, spec *resourceapi.ResourceClaimSpec, alts []*Alternative, candidates []int) string {
	for ri, r := range spec.Devices.Requests {
		var own []*Alternative
		satisfiable := false
		for _, a := range alts {
			if a.Request != ri {
				continue
			}
			own = append(own, a)
			for n := range s.nodes {
				if a.fits(n) {
					satisfiable = true
				}
			}
		}
		if satisfiable {
			continue
		}
		if len(own) == 1 {
			return "request " + describeAlt(s, own[0])
		}
		parts := make([]string, 0, len(own))
		for _, a := range own {
			parts = append(parts, describeAlt(s, a))
		}
		return fmt.Sprintf("request %s: no firstAvailable alternative fits: %s", r.Name, strings.Join(parts, "; "))
	}
	// Every request fits somewhere alone, but not all of them on one node.
	best, bestTotal := -1, -1
	pool := candidates
	if len(pool) == 0 {
		pool = make([]int, len(s.nodes))
		for i := range pool {
			pool[i] = i
		}
	}
	for _, n := range pool {
		total := 0
		for _, a := range alts {
			total += a.Counts[n]
		}
		if total > bestTotal {
			best, bestTotal = n, total
		}
	}
	names := make([]string, 0, len(spec.Devices.Requests))
	for _, r := range spec.Devices.Requests {
		names = append(names, r.Name)
	}
	what := "requests " + strings.Join(names, ", ") + " cannot be satisfied together on any single node"
	if len(spec.Devices.Constraints) > 0 {
		what += " with the claim's constraints"
	}
	if best < 0 {
		return what
	}
	var counts []string
	for _, a := range alts {
		counts = append(counts, fmt.Sprintf("%s %d", a.Name, a.Counts[best]))
	}
	return fmt.Sprintf("%s; best node %s has matching devices: %s", what, s.nodes[best].Name, strings.Join(counts, ", "))
}

func describeAlt(s *Snapshot, a *Alternative) string {
	best, bestCount := -1, 0
	for n := range s.nodes {
		if best < 0 || a.Counts[n] > bestCount {
			best, bestCount = n, a.Counts[n]
		}
	}
	if bestCount == 0 && a.CapacityShort != "" {
		return fmt.Sprintf("%s: %s", a.Name, a.CapacityShort)
	}
	if bestCount == 0 {
		if a.Wanted < 0 {
			return fmt.Sprintf("%s: allocationMode All, but no published device matches its class and selectors", a.Name)
		}
		return fmt.Sprintf("%s: %d wanted, no published device matches its class and selectors", a.Name, a.Wanted)
	}
	return fmt.Sprintf("%s: %d wanted, best node %s has %d matching", a.Name, a.Wanted, s.nodes[best].Name, bestCount)
}
