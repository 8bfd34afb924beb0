// Package feasibility is the admission check "could the scheduler allocate this claim?": it
// answers from the published ResourceSlices, DeviceClasses and Nodes, using the scheduler's own
// allocator (k8s.io/dynamic-resource-allocation/structured) with the work bounded for large
// clusters: devices are grouped by the attribute values a request reads, selector results are
// cached per group, nodes without a matching device are skipped and nodes of the same shape are
// tried once. Why a claim waits, against the current allocations, is package diagnosis's; the
// Snapshot and match methods exported here are what it reads.
package feasibility

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

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

// Option configures a View.
type Option func(*View)

// WithServed makes the allocator run with the features served says the cluster serves. Without
// it (kubectl dra, tests) the published objects tell: a shared device or a counter set is only
// stored by an API server that serves its feature.
func WithServed(served Served) Option { return func(v *View) { v.served = served } }

// WithTimeout bounds the allocator's search per question (default searchTimeout); tests on a
// loaded machine lengthen it.
func WithTimeout(d time.Duration) Option { return func(v *View) { v.timeout = d } }

// View is the cached, indexed inventory. Call Invalidate when the lister's content changes.
type View struct {
	lister  Lister
	checker *celcheck.Checker
	// celCache is the DRA library's LRU of compiled selectors, shared with the allocator.
	celCache *dracel.Cache
	served   Served

	// timeout is searchTimeout unless WithTimeout says otherwise.
	timeout time.Duration

	generation atomic.Uint64
	mu         sync.Mutex
	// snap is the index of one published state, replaced when Invalidate moved the generation on.
	snap *Snapshot

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
	return v
}

// Invalidate marks the cached index stale; the next question rebuilds it.
func (v *View) Invalidate() { v.generation.Add(1) }

// Timeout is how long one question may search: the admission budget.
func (v *View) Timeout() time.Duration { return v.timeout }

// Checker is the selector analyzer the view was made with.
func (v *View) Checker() *celcheck.Checker { return v.checker }

// baseFeatures are the stable allocator's, which every supported release serves (fields of an
// unserved one are dropped by the API server before anything reaches the allocator).
var baseFeatures = structured.Features{AdminAccess: true, PrioritizedList: true, DeviceTaints: true}

// Features is what the allocator runs with for questions about s: the features the cluster
// serves. Where the API server cannot be asked (or the probe fails), the published objects stand
// in for it: a shared device or a counter set is only ever stored where its feature is served.
func (v *View) Features(ctx context.Context, s *Snapshot) structured.Features {
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
	s, err := v.Snapshot()
	if err != nil {
		return false, err
	}
	return s.sharedDrivers[driver], nil
}

// DeviceClass returns the named class, or nil when it does not exist.
func (v *View) DeviceClass(name string) (*resourceapi.DeviceClass, error) {
	s, err := v.Snapshot()
	if err != nil {
		return nil, err
	}
	return s.classes[name], nil
}

// Snapshot is the index of the current published state, built at the first question after
// Invalidate.
func (v *View) Snapshot() (*Snapshot, error) {
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
