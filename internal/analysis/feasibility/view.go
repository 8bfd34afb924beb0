// Package feasibility answers "could the scheduler allocate this claim right now?" from the
// published ResourceSlices, DeviceClasses and Nodes, using the scheduler's own allocator
// (k8s.io/dynamic-resource-allocation/structured) with the work bounded for large clusters:
// devices are grouped by the attribute values a request reads, selector results are cached per
// group, nodes without a matching device are skipped and nodes of the same shape are tried once.
package feasibility

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/utils/lru"

	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
)

// Lister reads the current published objects: inventory.Informers in the webhook, a fixed
// inventory.Objects in kubectl dra and in tests.
type Lister interface {
	Published() (*inventory.Objects, error)
}

// Served tells which optional DRA features the cluster serves (servedfeatures.Detector): the
// allocator runs with those, as the scheduler does with its gates (assumed to match the API
// server's, as they do with every release's defaults).
type Served interface {
	// ConsumableCapacity: the API server keeps capacity requests and shared devices (KEP-5075).
	ConsumableCapacity(ctx context.Context) (bool, error)
	// PartitionableDevices: the stored slices show counters kept (KEP-4815).
	PartitionableDevices(ctx context.Context, slices []*resourceapi.ResourceSlice) bool
}

// ClaimLister reads the cluster's ResourceClaims, of which only the metadata and
// status.allocation (and reservedFor, for the names of the pods holding devices) matter here.
type ClaimLister interface {
	Claims() ([]*resourceapi.ResourceClaim, error)
}

// Option configures a View.
type Option func(*View)

// WithServed makes the allocator run with the features served says the cluster serves. Without
// it (kubectl dra, tests) the published objects tell: a shared device or a counter set is only
// stored by an API server that serves its feature.
func WithServed(served Served) Option { return func(v *View) { v.served = served } }

// WithClaims lets HeldNow judge a claim against what the current allocations leave free; call
// InvalidateClaims when what claims lists changes.
func WithClaims(claims ClaimLister) Option { return func(v *View) { v.claims = claims } }

// View is the cached, indexed inventory. Call Invalidate when the lister's content changes.
type View struct {
	lister  Lister
	checker *celcheck.Checker
	// celCache is the DRA library's LRU of compiled selectors, shared with the allocator.
	celCache *dracel.Cache
	served   Served
	claims   ClaimLister

	// claimsGeneration moves on with every change of what claims lists; held is the fleet of one
	// snapshot and one generation of claims.
	claimsGeneration atomic.Uint64
	heldMu           sync.Mutex
	held             *heldState

	// timeout is searchTimeout; tests on a loaded machine lengthen it.
	timeout time.Duration

	generation atomic.Uint64
	mu         sync.Mutex
	// snap is the index of one published state, replaced when Invalidate moved the generation on.
	snap *snapshot

	matchMu sync.RWMutex
	// matches caches selector verdicts by (digest of the selectors, device values they read); the
	// answer depends on nothing else, so it survives inventory changes. Cleared when it reaches
	// maxMatches rather than LRU-evicted: an LRU's per-entry bookkeeping would outweigh these
	// one-bool entries under the webhook's memory limit, and refilling costs one CEL evaluation per
	// device group.
	matches map[string]bool
}

const (
	// verdictCacheSize bounds the verdicts remembered per published state. Every pod created from
	// a template brings a claim with the same spec, so most questions repeat until the published
	// objects change.
	verdictCacheSize = 1024
	// matchResultsSize bounds the device matches remembered per published state, one per list of
	// selectors (a request's class and its own).
	matchResultsSize = 1024
	// matchResultsBytes bounds them by size too: an entry holds a count per node and a flag per
	// device, 80 KB at 5,000 nodes of 8 GPUs.
	matchResultsBytes = 16 << 20
	// maxMatches bounds View.matches.
	maxMatches = 200_000
	// fullSize bounds the nodes whose slices as published are kept per published state: the
	// allocator reads those, and runs on at most maxShapes nodes per question.
	fullSize = 64
	// searchTimeout bounds the allocator's search per question. The search is exhaustive and can
	// be exponential in the number of requests; the scheduler bounds it the same way. A question
	// that runs out of time is answered "unknown", never with a warning.
	searchTimeout = 250 * time.Millisecond
)

// New returns a view over lister; checker (shared with the validator, so selectors are analyzed
// once) tells which attributes selectors read.
func New(lister Lister, checker *celcheck.Checker, opts ...Option) *View {
	v := &View{
		lister:   lister,
		checker:  checker,
		celCache: dracel.NewCache(1024, dracel.Features{EnableConsumableCapacity: true, EnableListTypeAttributes: true}),
		matches:  map[string]bool{},
		timeout:  searchTimeout,
	}
	for _, o := range opts {
		o(v)
	}
	v.generation.Store(1)
	v.claimsGeneration.Store(1)
	return v
}

// Invalidate marks the cached index stale; the next question rebuilds it.
func (v *View) Invalidate() { v.generation.Add(1) }

// InvalidateClaims says that what the ClaimLister lists has changed.
func (v *View) InvalidateClaims() { v.claimsGeneration.Add(1) }

// baseFeatures are the stable allocator's, which every supported release serves (fields of an
// unserved one are dropped by the API server before anything reaches the allocator).
var baseFeatures = structured.Features{AdminAccess: true, PrioritizedList: true, DeviceTaints: true}

// featuresFor is what the allocator runs with for questions about s: the features the cluster
// serves. Where the API server cannot be asked (or the probe fails), the published objects stand
// in for it: a shared device or a counter set is only ever stored where its feature is served.
func (v *View) featuresFor(ctx context.Context, s *snapshot) structured.Features {
	f := baseFeatures
	f.ConsumableCapacity, f.PartitionableDevices = s.anyShared, s.anyCounters
	if v.served == nil {
		return f
	}
	s.partitionableOnce.Do(func() { s.partitionable = v.served.PartitionableDevices(ctx, s.counterSample) })
	f.PartitionableDevices = s.partitionable
	if served, err := v.served.ConsumableCapacity(ctx); err != nil {
		klog.FromContext(ctx).V(2).Info("Cannot tell whether the API server serves consumable capacity; judging by the published devices", "err", err)
	} else {
		f.ConsumableCapacity = served
	}
	return f
}

// PublishesShared reports whether driver publishes a device that several claims may share
// (allowMultipleAllocations), which only an API server serving consumable capacity stores.
func (v *View) PublishesShared(driver string) (bool, error) {
	s, err := v.current()
	if err != nil {
		return false, err
	}
	return s.sharedDrivers[driver], nil
}

// DeviceClass returns the named class, or nil when it does not exist.
func (v *View) DeviceClass(name string) (*resourceapi.DeviceClass, error) {
	s, err := v.current()
	if err != nil {
		return nil, err
	}
	return s.classes[name], nil
}

// device is one published device: entry index of the snapshot's slices[in]. Kept small and
// without pointers (a fleet has tens of thousands, which the collector then need not scan); dev
// gives the device with its slice.
type device struct {
	index int32
	in    int32
	// taint indexes snapshot.taints.
	taint int32
}

// devRef is device i of a snapshot, with its slice.
type devRef struct {
	slice *inventory.Slice
	index int32
}

// dev returns device i.
func (s *snapshot) dev(i int) devRef {
	d := &s.devices[i]
	return devRef{slice: s.slices[d.in], index: d.index}
}

func (d devRef) published() *resourceapi.Device { return &d.slice.Spec.Devices[d.index] }

func (d devRef) id() structured.DeviceID {
	return structured.MakeDeviceID(d.slice.Spec.Driver, d.slice.Spec.Pool.Name, d.published().Name)
}

// is: d is the device driver/pool/name.
func (d devRef) is(driver, pool, name string) bool {
	return d.published().Name == name && d.slice.Spec.Pool.Name == pool && d.slice.Spec.Driver == driver
}

// celInput is what the CEL selectors see of d.
func (d devRef) celInput() dracel.Device {
	p := d.published()
	return dracel.Device{Driver: d.slice.Spec.Driver, AllowMultipleAllocations: p.AllowMultipleAllocations, Attributes: d.slice.Attributes(int(d.index)), Capacity: p.Capacity}
}

type snapshot struct {
	generation uint64
	// slices are the published slices as listed.
	slices    []*inventory.Slice
	classes   map[string]*resourceapi.DeviceClass
	nodes     []*inventory.Node // sorted by name
	nodeIndex map[string]int
	// nodeSlices are the slices each node sees: its own plus those shared with it.
	nodeSlices [][]*inventory.Slice
	// full caches the slices as published of the nodes the allocator ran on (LRU by node, fullSize).
	full    *lru.Cache
	devices []device
	// nodeDevices are the indices of the devices each node can use.
	nodeDevices [][]int
	// sliceNodes are the nodes each slice's devices are usable from (nodesOf).
	sliceNodes [][]int
	// taints are the devices' taints, each set once (taintKey); taints[0] is none.
	taints []string
	// exact disables grouping of nodes by shape when pools are partitioned or incomplete, where
	// devices of equal attributes are not interchangeable.
	exact bool
	// anyShared: some device allows multiple allocations; sharedDrivers are the drivers of those.
	anyShared     bool
	sharedDrivers map[string]bool
	// anyCounters: some slice has counter sets or a device consuming them.
	anyCounters bool
	// partitionable is the Served answer for these slices, asked once; counterSample is a slice
	// with counters, if there is one: the Served question is whether any is stored.
	partitionableOnce sync.Once
	partitionable     bool
	counterSample     []*resourceapi.ResourceSlice

	// projections are not evicted: there is one per set of attributes the selectors read, and the
	// snapshot drops them all at the next published change.
	projMu      sync.Mutex
	projections map[string]*projection
	// matchResults caches *deviceMatches by selectors (LRU, matchResultsSize entries and
	// matchResultsBytes).
	matchResults *lru.Cache
	// verdicts caches Unsatisfiable answers by namespace and spec (LRU, verdictCacheSize).
	verdicts *lru.Cache
}

// projection groups the devices by the values of the attributes a set of selectors reads.
type projection struct {
	keys   []string
	groups map[string][]int
	order  []string
}

func (v *View) current() (*snapshot, error) {
	gen := v.generation.Load()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.snap != nil && v.snap.generation == gen {
		return v.snap, nil
	}
	s, err := v.build(gen)
	if err != nil {
		return nil, err
	}
	v.snap = s
	return s, nil
}

func (v *View) build(gen uint64) (*snapshot, error) {
	objs, err := v.lister.Published()
	if err != nil {
		return nil, fmt.Errorf("list published objects: %w", err)
	}
	slices, classes, nodes := objs.CompactSlices, objs.Classes, objs.CompactNodes
	if slices == nil || nodes == nil {
		in := inventory.NewInterner()
		if slices == nil {
			slices = inventory.Compact(in, objs.Slices)
		}
		if nodes == nil {
			nodes = inventory.CompactNodes(in, objs.Nodes)
		}
	}
	s := &snapshot{generation: gen, slices: slices, classes: map[string]*resourceapi.DeviceClass{}, nodeIndex: map[string]int{}, sharedDrivers: map[string]bool{},
		projections: map[string]*projection{}, verdicts: lru.New(verdictCacheSize), full: lru.New(fullSize)}
	for _, c := range classes {
		s.classes[c.Name] = c
	}
	addNode := func(n *inventory.Node) {
		if _, ok := s.nodeIndex[n.Name]; !ok {
			s.nodeIndex[n.Name] = -1
			s.nodes = append(s.nodes, n)
		}
	}
	for _, n := range nodes {
		addNode(n)
	}
	// A slice may name a node the cache has not seen (offline inventories list no nodes).
	for _, sl := range slices {
		if sl.Spec.NodeName != nil && *sl.Spec.NodeName != "" {
			addNode(&inventory.Node{ObjectMeta: metav1.ObjectMeta{Name: *sl.Spec.NodeName}})
		}
	}
	sort.Slice(s.nodes, func(i, j int) bool { return s.nodes[i].Name < s.nodes[j].Name })
	for i, n := range s.nodes {
		s.nodeIndex[n.Name] = i
	}
	s.nodeSlices = make([][]*inventory.Slice, len(s.nodes))
	s.sliceNodes = make([][]int, len(slices))
	s.taints = []string{""}
	taintIndex := map[string]int32{"": 0}
	s.nodeDevices = make([][]int, len(s.nodes))

	var fullNodes []*v1.Node
	poolSlices := map[string]int{}
	poolWant := map[string]int64{}
	for si, sl := range slices {
		pool := sl.Spec.Driver + "/" + sl.Spec.Pool.Name
		poolSlices[pool]++
		poolWant[pool] = sl.Spec.Pool.ResourceSliceCount
		counters := len(sl.Spec.SharedCounters) > 0
		var users []int
		if sl.Spec.NodeName != nil && *sl.Spec.NodeName != "" {
			users = []int{s.nodeIndex[*sl.Spec.NodeName]}
		} else {
			if fullNodes == nil {
				// As the allocator reads them, for this build only: kept, they would be the
				// kilobyte a node that inventory.Node saves.
				fullNodes = make([]*v1.Node, len(s.nodes))
				for i, n := range s.nodes {
					fullNodes[i] = n.Full()
				}
			}
			for i, n := range fullNodes {
				ok, err := structured.NodeMatches(baseFeatures, n, "", ptrTrue(sl.Spec.AllNodes), sl.Spec.NodeSelector)
				if err == nil && (ok || sl.Spec.PerDeviceNodeSelection != nil) {
					users = append(users, i)
				}
			}
			if sl.Spec.PerDeviceNodeSelection != nil {
				s.exact = true
			}
		}
		s.sliceNodes[si] = users
		for _, u := range users {
			s.nodeSlices[u] = append(s.nodeSlices[u], sl)
		}
		for i := range sl.Spec.Devices {
			d := &sl.Spec.Devices[i]
			counters = counters || len(d.ConsumesCounters) > 0
			if ptrTrue(d.AllowMultipleAllocations) {
				s.anyShared = true
				s.sharedDrivers[sl.Spec.Driver] = true
			}
			idx := len(s.devices)
			taint, ok := taintIndex[taintKey(d.Taints)]
			if !ok {
				taint = int32(len(s.taints))
				taintIndex[taintKey(d.Taints)] = taint
				s.taints = append(s.taints, taintKey(d.Taints))
			}
			s.devices = append(s.devices, device{index: int32(i), in: int32(si), taint: taint})
			for _, u := range users {
				s.nodeDevices[u] = append(s.nodeDevices[u], idx)
			}
		}
		if counters {
			s.exact, s.anyCounters = true, true
			if s.counterSample == nil {
				s.counterSample = []*resourceapi.ResourceSlice{sl.Full()}
			}
		}
	}
	for pool, n := range poolSlices {
		if int64(n) != poolWant[pool] {
			s.exact = true
		}
	}
	entry := 8*len(s.nodes) + len(s.devices) + 64
	s.matchResults = lru.New(min(matchResultsSize, max(16, matchResultsBytes/entry)))
	return s, nil
}

// nodesOf are the nodes device d is usable from.
func (s *snapshot) nodesOf(d int) []int { return s.sliceNodes[s.devices[d].in] }

// taintOf is device d's taintKey.
func (s *snapshot) taintOf(d int) string { return s.taints[s.devices[d].taint] }

func ptrTrue(b *bool) bool { return b != nil && *b }

func taintKey(taints []resourceapi.DeviceTaint) string {
	if len(taints) == 0 {
		return ""
	}
	parts := make([]string, 0, len(taints))
	for _, t := range taints {
		parts = append(parts, t.Key+"="+t.Value+":"+string(t.Effect))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// attributeValue finds a device attribute by domain and name the way the CEL environment does:
// names without a domain belong to the device's driver.
func attributeValue(d devRef, domain, name string) (string, bool) {
	if domain == d.slice.Spec.Driver {
		if a, ok := d.slice.Attribute(int(d.index), resourceapi.QualifiedName(name)); ok {
			return attrString(a), true
		}
	}
	if a, ok := d.slice.Attribute(int(d.index), resourceapi.QualifiedName(domain+"/"+name)); ok {
		return attrString(a), true
	}
	return "", false
}

func capacityValue(d devRef, domain, name string) (string, bool) {
	caps := d.published().Capacity
	if domain == d.slice.Spec.Driver {
		if c, ok := caps[resourceapi.QualifiedName(name)]; ok {
			return c.Value.String(), true
		}
	}
	if c, ok := caps[resourceapi.QualifiedName(domain+"/"+name)]; ok {
		return c.Value.String(), true
	}
	return "", false
}

func attrString(a resourceapi.DeviceAttribute) string {
	switch {
	case a.IntValue != nil:
		return fmt.Sprintf("i%d", *a.IntValue)
	case a.BoolValue != nil:
		return fmt.Sprintf("b%t", *a.BoolValue)
	case a.StringValue != nil:
		return "s" + *a.StringValue
	case a.VersionValue != nil:
		return "v" + *a.VersionValue
	}
	return fmt.Sprintf("%v", a)
}

// fullKey identifies every value of a device a selector could read.
func fullKey(d devRef) string {
	var b strings.Builder
	b.WriteString(d.slice.Spec.Driver)
	p := d.published()
	var names []string
	d.slice.RangeAttributes(int(d.index), func(n resourceapi.QualifiedName, a resourceapi.DeviceAttribute) {
		names = append(names, "a"+string(n)+"="+attrString(a))
	})
	for n, c := range p.Capacity {
		names = append(names, "c"+string(n)+"="+c.Value.String())
	}
	sort.Strings(names)
	for _, n := range names {
		b.WriteByte(0)
		b.WriteString(n)
	}
	if p.AllowMultipleAllocations != nil {
		fmt.Fprintf(&b, "\x00m%t", *p.AllowMultipleAllocations)
	}
	return b.String()
}

// refsKey names a set of references; "" with opaque means "everything".
func refsKey(refs []celcheck.Ref, opaque bool) string {
	if opaque {
		return "*"
	}
	parts := make([]string, 0, len(refs))
	for _, r := range refs {
		parts = append(parts, fmt.Sprintf("%t/%s/%s", r.Capacity, r.Domain, r.Name))
	}
	sort.Strings(parts)
	return strings.Join(parts, "\x00")
}

// projectionFor groups the devices by the values refs read; cached per snapshot.
func (s *snapshot) projectionFor(refs []celcheck.Ref, opaque bool) *projection {
	key := refsKey(refs, opaque)
	s.projMu.Lock()
	defer s.projMu.Unlock()
	if p, ok := s.projections[key]; ok {
		return p
	}
	p := &projection{keys: make([]string, len(s.devices)), groups: map[string][]int{}}
	var b strings.Builder
	for i := range s.devices {
		d := s.dev(i)
		var k string
		if opaque {
			k = fullKey(d)
		} else {
			b.Reset()
			b.WriteString(d.slice.Spec.Driver)
			for _, r := range refs {
				b.WriteByte(0)
				var val string
				var ok bool
				if r.Capacity {
					val, ok = capacityValue(d, r.Domain, r.Name)
				} else {
					val, ok = attributeValue(d, r.Domain, r.Name)
				}
				if ok {
					b.WriteString(val)
				} else {
					b.WriteString("\x01missing")
				}
			}
			k = b.String()
		}
		// Devices of a group share its first key: thousands of nodes of one shape keep one string.
		if g, ok := p.groups[k]; ok {
			k = p.keys[g[0]]
		} else {
			p.order = append(p.order, k)
		}
		p.keys[i] = k
		p.groups[k] = append(p.groups[k], i)
	}
	s.projections[key] = p
	return p
}

// classLister serves the snapshot's classes to the allocator.
type classLister struct{ s *snapshot }

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l.s.classes))
	for _, c := range l.s.classes {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l.s.classes[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("DeviceClass %q not found", name)
}
