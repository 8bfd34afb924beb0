package feasibility

import (
	"fmt"
	"iter"
	"sort"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/lru"

	"github.com/gpu-dra/gpu-dra/internal/analysis/answers"
	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
)

// device is one published device of the snapshot's slices[in]: the slice's devices are numbered
// one after the other from sliceFirst[in]. Kept small and without pointers (a fleet has tens of
// thousands, which the collector then need not scan); dev gives the device with its slice.
type device struct {
	in int32
}

// devRef is device i of a snapshot, with its slice.
type devRef struct {
	slice *inventory.Slice
	index int32
}

// dev returns device i.
func (s *Snapshot) dev(i int) devRef {
	in := s.devices[i].in
	return devRef{slice: s.slices[in], index: int32(i) - s.sliceFirst[in]}
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

// Snapshot indexes one published state: nodes and devices are numbered (nodes sorted by name),
// and the answers found against it are cached with it. Its methods are what the diagnosis reads.
type Snapshot struct {
	generation uint64
	// slices are the published slices as listed.
	slices  []*inventory.Slice
	classes map[string]*resourceapi.DeviceClass
	// nodes are sorted by name, no two of one name (NodeIndex searches them).
	nodes []*inventory.Node
	// nodeSlices are the slices each node sees, by number: its own plus those shared with it.
	nodeSlices flat[int32]
	// full caches the slices as published of the nodes the allocator ran on (LRU by node, fullSize).
	full    *lru.Cache
	devices []device
	// sliceFirst is the number of each slice's first device.
	sliceFirst []int32
	// sliceNodes are the nodes each slice's devices are usable from (nodesOf).
	sliceNodes flat[int]
	// taints are the devices' taints, each set once (taintKey); taints[0] is none. deviceTaints
	// index them by device, nil while no device has a taint, as in most fleets.
	taints       []string
	deviceTaints []int32
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
	// matchResults caches *Matches by selectors (LRU, matchResultsSize entries and
	// matchResultsBytes).
	matchResults *lru.Cache
	// verdicts caches Unsatisfiable answers by namespace and spec (LRU, verdictCacheSize), and
	// has each searched once at a time.
	verdicts *answers.Cache
}

// projection groups the devices by the values of the attributes a set of selectors reads: order
// are the groups' keys, in the order of their first devices, and members the devices of each.
type projection struct {
	order   []string
	members flat[int32]
}

func (v *View) build(gen uint64) (*Snapshot, error) {
	objs, err := v.lister.Published()
	if err != nil {
		return nil, fmt.Errorf("list published objects: %w", err)
	}
	slices, classes, nodes := objs.CompactSlices, objs.Classes, objs.CompactNodes
	if slices == nil {
		// A fixed inventory (kubectl dra, tests) is indexed once: nothing to share over time.
		slices = inventory.Wrap(objs.Slices)
	}
	if nodes == nil {
		nodes = inventory.CompactNodes(inventory.NewInterner(), objs.Nodes)
	}
	s := &Snapshot{generation: gen, slices: slices, classes: map[string]*resourceapi.DeviceClass{}, sharedDrivers: map[string]bool{},
		projections: map[string]*projection{}, verdicts: answers.New(verdictCacheSize), full: lru.New(fullSize)}
	for _, c := range classes {
		s.classes[c.Name] = c
	}
	s.indexNodes(nodes)
	s.indexDevices()
	entry := 8*len(s.nodes) + len(s.devices) + 64
	s.matchResults = lru.New(min(matchResultsSize, max(16, matchResultsBytes/entry)))
	return s, nil
}

// taintOf is device d's taintKey.
func (s *Snapshot) taintOf(d int) string {
	if s.deviceTaints == nil {
		return ""
	}
	return s.taints[s.deviceTaints[d]]
}

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
func (s *Snapshot) projectionFor(refs []celcheck.Ref, opaque bool) *projection {
	key := refsKey(refs, opaque)
	s.projMu.Lock()
	defer s.projMu.Unlock()
	if p, ok := s.projections[key]; ok {
		return p
	}
	// Each device's group first, then the groups' members: a list per group would be a slice
	// header and up to twice its length (append's growth) a group.
	groupOf := make([]int32, len(s.devices))
	groups := map[string]int32{}
	var order []string
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
		g, ok := groups[k]
		if !ok {
			g = int32(len(order))
			groups[k] = g
			order = append(order, k)
		}
		groupOf[i] = g
	}
	p := &projection{order: order, members: group(len(order), groupOf)}
	s.projections[key] = p
	return p
}

// classLister serves the snapshot's classes to the allocator.
type classLister struct{ s *Snapshot }

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

// NumNodes is the number of nodes; nodes are numbered 0..NumNodes()-1 in name order.
func (s *Snapshot) NumNodes() int { return len(s.nodes) }

// NodeName is the name of node n.
func (s *Snapshot) NodeName(n int) string { return s.nodes[n].Name }

// NodeIndex is the number of the named node.
func (s *Snapshot) NodeIndex(name string) (int, bool) {
	return sort.Find(len(s.nodes), func(i int) int { return strings.Compare(name, s.nodes[i].Name) })
}

// NodeDevices are the devices node n can use: those of the slices it sees, in order. They are not
// kept as a list of their own, which would be an int32 for every device of the fleet.
func (s *Snapshot) NodeDevices(n int) iter.Seq[int32] {
	return func(yield func(int32) bool) {
		for _, si := range s.nodeSlices.of(n) {
			for d, end := s.sliceFirst[si], s.sliceEnd(si); d < end; d++ {
				if !yield(d) {
					return
				}
			}
		}
	}
}

// sliceEnd is the number after slice si's last device.
func (s *Snapshot) sliceEnd(si int32) int32 {
	if int(si)+1 < len(s.sliceFirst) {
		return s.sliceFirst[si+1]
	}
	return int32(len(s.devices))
}

// NodesOf are the nodes device d is usable from.
func (s *Snapshot) NodesOf(d int) []int { return s.sliceNodes.of(int(s.devices[d].in)) }

// NumDevices is the number of devices; devices are numbered 0..NumDevices()-1.
func (s *Snapshot) NumDevices() int { return len(s.devices) }

// DeviceIs: device d is the device driver/pool/name.
func (s *Snapshot) DeviceIs(d int, driver, pool, name string) bool {
	return s.dev(d).is(driver, pool, name)
}

// DeviceID is device d's ID, as the allocator names it.
func (s *Snapshot) DeviceID(d int) structured.DeviceID { return s.dev(d).id() }

// Class is the named DeviceClass, nil when there is none.
func (s *Snapshot) Class(name string) *resourceapi.DeviceClass { return s.classes[name] }

// ClassNames are the names of the DeviceClasses, sorted.
func (s *Snapshot) ClassNames() []string {
	names := make([]string, 0, len(s.classes))
	for n := range s.classes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Slices are the published slices, as listed.
func (s *Snapshot) Slices() []*inventory.Slice { return s.slices }

// Attribute is device d's value of the attribute domain/name, looked up as the CEL environment
// does (names without a domain belong to the device's driver), as a value key: a letter for the
// type (i, b, s, v) and the value.
func (s *Snapshot) Attribute(d int, domain, name string) (string, bool) {
	return attributeValue(s.dev(d), domain, name)
}

// Capacity is device d's capacity domain/name, as a quantity.
func (s *Snapshot) Capacity(d int, domain, name string) (string, bool) {
	return capacityValue(s.dev(d), domain, name)
}

// RangeAttributes calls f with each attribute of device d: its fully qualified name and its value
// key (see Attribute).
func (s *Snapshot) RangeAttributes(d int, f func(name, value string)) {
	dev := s.dev(d)
	dev.slice.RangeAttributes(int(dev.index), func(qn resourceapi.QualifiedName, a resourceapi.DeviceAttribute) {
		full := string(qn)
		if !strings.Contains(full, "/") {
			full = dev.slice.Spec.Driver + "/" + full
		}
		f(full, attrString(a))
	})
}
