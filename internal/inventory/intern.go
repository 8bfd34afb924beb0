package inventory

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"unsafe"
	"weak"

	resourceapi "k8s.io/api/resource/v1"
)

// DefaultInternBudget bounds what an Interner's tables hold, values and keys as entrySize
// estimates them. The values are those the kept objects use (an entry goes with the last object
// holding it), so the budget bounds how much of them is shared rather than adding to them: a fleet
// of a few device shapes needs well under a megabyte, 5,000 nodes with device lists of their own
// (8 GPUs, a model and memory size per node) about 65 MiB, and past the budget devices keep their
// own maps, as if every node were different.
const DefaultInternBudget = 64 << 20

// Interner shares equal strings, attribute values, attribute maps, capacity maps, device lists,
// label maps and label key lists between the objects the informers cache. Safe for concurrent
// use; the zero value is not usable, use NewInterner.
//
// Its tables are bounded by bytes (WithByteBudget): a value that does not fit stays its object's
// own, unshared. An entry lives as long as a kept object uses it: each object built through the
// Interner holds a reference to the entries it took, released once the object is unreachable
// (replaced or deleted in the informer's store, and dropped by every reader), so that whatever
// path an object leaves by (a watch event, a relist, a list abandoned halfway) its entries go too.
type Interner struct {
	mu     sync.Mutex
	budget int
	// bytes and entries are what the tables hold, bytes as estimated by entrySize.
	bytes, entries int
	// strs holds one copy of each string seen (names, models, versions, label values), and the
	// pointer attribute values share.
	strs     map[string]*entry
	attrMaps map[string]*entry
	capMaps  map[string]*entry
	// deviceLists are slices' device lists, their own attributes apart.
	deviceLists map[string]*entry
	labelMaps   map[string]*entry
	keyLists    map[string]*entry
	nodeShapes  map[string]*entry
	// holds are the sets of entries objects hold, keyed by the entries' addresses: the nodes of
	// a group hold the same entries, and one entry for them all is a word a node rather than a
	// list a node.
	holds map[string]*entry
	// releaseFn is release of one entry, made once: a method value made per object would be an
	// allocation per object.
	releaseFn func(*entry)
}

// InternerOption configures an Interner.
type InternerOption func(*Interner)

// WithByteBudget bounds what the tables hold to about n bytes; 0 shares nothing.
func WithByteBudget(n int) InternerOption { return func(in *Interner) { in.budget = max(n, 0) } }

// NewInterner returns an empty Interner with DefaultInternBudget.
func NewInterner(opts ...InternerOption) *Interner {
	in := &Interner{
		budget:      DefaultInternBudget,
		strs:        map[string]*entry{},
		attrMaps:    map[string]*entry{},
		capMaps:     map[string]*entry{},
		deviceLists: map[string]*entry{},
		labelMaps:   map[string]*entry{},
		keyLists:    map[string]*entry{},
		nodeShapes:  map[string]*entry{},
		holds:       map[string]*entry{},
	}
	in.releaseFn = in.releaseOne
	for _, o := range opts {
		o(in)
	}
	return in
}

// entry is one shared value. refs counts the kept objects and the other entries (parts) that use it.
// An entry in no table (table nil) is the set of entries one object holds, which no other object
// shares (holdSet): releasing it releases its parts.
type entry struct {
	key   string
	value any
	refs  int
	size  int
	table map[string]*entry
	// parts are the entries value is made of (a map's names and strings), held while it lives.
	parts []*entry
	// token is the holding that objects holding this entry alone, or this set, share while one
	// of them lives (hold).
	token weak.Pointer[holding]
}

// The sizes an entry is estimated at, by construction: the entry itself with its table slot, and
// what its value adds.
var (
	entryOverhead  = int(unsafe.Sizeof(entry{})) + 48
	attrSlot       = unsafe.Sizeof(resourceapi.QualifiedName("")) + unsafe.Sizeof(resourceapi.DeviceAttribute{})
	capacitySlot   = unsafe.Sizeof(resourceapi.QualifiedName("")) + unsafe.Sizeof(resourceapi.DeviceCapacity{})
	labelSlot      = 2 * unsafe.Sizeof("")
	deviceSize     = int(unsafe.Sizeof(resourceapi.Device{}))
	stringHeadSize = int(unsafe.Sizeof(""))
)

// mapBytes estimates a Go map of n entries of slot bytes each: groups of eight slots and their
// control word, filled to 7/8 at most.
func mapBytes(n int, slot uintptr) int {
	groups := max(1, (n*8/7+7)/8)
	return 48 + groups*(8+8*int(slot))
}

// entrySize is what an entry under key costs with its value of valueBytes.
func entrySize(key string, valueBytes int) int { return entryOverhead + len(key) + valueBytes }

// take (in.mu held) returns the value table holds under key, and counts held's reference to it.
func take(table map[string]*entry, key string, held *[]*entry) (any, bool) {
	e, ok := table[key]
	if !ok {
		return nil, false
	}
	e.refs++
	*held = append(*held, e)
	return e.value, true
}

// fits (in.mu held): an entry of size bytes fits the budget.
func (in *Interner) fits(size int) bool { return in.bytes+size <= in.budget }

// add (in.mu held) stores value under key with the parts it is made of, referenced by held.
func (in *Interner) add(table map[string]*entry, key string, size int, value any, parts []*entry, held *[]*entry) {
	e := &entry{key: key, value: value, refs: 1, size: size, table: table, parts: parts}
	table[key] = e
	in.bytes += size
	in.entries++
	*held = append(*held, e)
}

// releaseOne drops one reference to e, and the entries no one references any more.
func (in *Interner) releaseOne(e *entry) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.releaseLocked(e)
}

func (in *Interner) releaseLocked(e *entry) {
	if e.refs--; e.refs > 0 {
		return
	}
	if e.table != nil {
		delete(e.table, e.key)
	}
	if e.size > 0 {
		in.bytes -= e.size
		in.entries--
	}
	for _, p := range e.parts {
		in.releaseLocked(p)
	}
	if in.entries == 0 && in.bytes == 0 {
		// Maps keep their room after deletions: empty, the tables start small again.
		in.strs, in.attrMaps, in.capMaps = map[string]*entry{}, map[string]*entry{}, map[string]*entry{}
		in.deviceLists, in.labelMaps, in.keyLists = map[string]*entry{}, map[string]*entry{}, map[string]*entry{}
		in.nodeShapes, in.holds = map[string]*entry{}, map[string]*entry{}
	}
}

// maxSharedSet is the most entries a set in holds has: a slice's driver, labels and device list.
const maxSharedSet = 4

// holding is what kept objects hold of the tables: a token of its own allocation (with a
// pointer, so never batched with others) that every copy of an object shares, and the objects
// that hold the same shared entries too (hold), whose cleanup releases the entries once none of
// them is left.
type holding struct {
	// labels are a slice's labels: slices rarely have any, and here they cost a Slice nothing.
	labels map[string]string
}

// hold (in.mu held) returns the holding of entries, each referenced once for it, with labels (a
// slice's); nil for neither. Objects that hold the same shared entries and labels share one
// holding, and so one cleanup, while any of them lives: the nodes of a group, their slices. A
// cleanup costs the runtime about 90 bytes besides the holding, most of what a node's objects
// cost it otherwise.
func (in *Interner) hold(entries []*entry, labels map[string]string) *holding {
	if len(entries) == 0 {
		if labels == nil {
			return nil
		}
		return &holding{labels: labels}
	}
	set := in.holdSet(entries)
	shareable := set.table != nil
	if shareable {
		// Labels the tables share are the same map on every slice that has them; labels of a
		// slice's own (past the budget) are never another's.
		if h := set.token.Value(); h != nil && sameMap(h.labels, labels) {
			// The live holding references the set once already, for all who share it.
			set.refs--
			return h
		}
	}
	h := &holding{labels: labels}
	runtime.AddCleanup(h, in.releaseFn, set)
	if shareable {
		set.token = weak.Make(h)
	}
	return h
}

// sameMap reports whether a and b are the same map (or both nil), not maps of equal contents.
func sameMap(a, b map[string]string) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// holdSet (in.mu held) returns one entry that holds entries (each referenced once by the caller),
// referenced once for the caller: the entry itself for one, else a set of them, shared through
// holds with every object holding the same entries. Sets are no values: neither counted nor
// charged to the budget (size 0). A set no other object is likely to share stays out of holds:
// one of entries is this object's alone, or there are more than a node of a group holds (its
// shared list's parts, past the budget).
func (in *Interner) holdSet(entries []*entry) *entry {
	if len(entries) == 1 {
		return entries[0]
	}
	if len(entries) > maxSharedSet {
		return &entry{refs: 1, parts: entries}
	}
	for _, e := range entries {
		if e.refs == 1 {
			return &entry{refs: 1, parts: entries}
		}
	}
	key := make([]byte, 0, len(entries)*int(unsafe.Sizeof(uintptr(0))))
	for _, e := range entries {
		// The set's parts keep its entries, so no address in a key is reused while it is one.
		key = binary.LittleEndian.AppendUint64(key, uint64(uintptr(unsafe.Pointer(e))))
	}
	if set, ok := in.holds[string(key)]; ok {
		set.refs++
		for _, e := range entries {
			// The set holds each already: this cannot be the last reference.
			e.refs--
		}
		return set
	}
	set := &entry{key: string(key), refs: 1, table: in.holds, parts: slices.Clip(entries)}
	in.holds[set.key] = set
	return set
}

// usage returns how many entries the tables hold and their estimated bytes.
func (in *Interner) usage() (entries, bytes int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.entries, in.bytes
}

// str (in.mu held) returns the shared copy of s, referenced by held, or s's own when the budget is
// full. Strings that never repeat (uuids, node names) pass through the table too: telling them
// apart would cost more than they do.
func (in *Interner) str(s string, held *[]*entry) *string {
	if v, ok := take(in.strs, s, held); ok {
		return v.(*string)
	}
	p := &s
	if size := entrySize(s, stringHeadSize); in.fits(size) {
		in.add(in.strs, s, size, p, nil, held)
	}
	return p
}

// smallInts are shared pointers for the integer attributes that repeat everywhere (indexes,
// counts); others get their own.
var smallInts = func() (out [256]int64) {
	for i := range out {
		out[i] = int64(i)
	}
	return out
}()

var boolValues = [2]bool{false, true}

func (in *Interner) attribute(a resourceapi.DeviceAttribute, held *[]*entry) resourceapi.DeviceAttribute {
	switch {
	case a.IntValue != nil:
		if v := *a.IntValue; v >= 0 && v < int64(len(smallInts)) {
			return resourceapi.DeviceAttribute{IntValue: &smallInts[v]}
		}
	case a.BoolValue != nil:
		if *a.BoolValue {
			return resourceapi.DeviceAttribute{BoolValue: &boolValues[1]}
		}
		return resourceapi.DeviceAttribute{BoolValue: &boolValues[0]}
	case a.StringValue != nil:
		return resourceapi.DeviceAttribute{StringValue: in.str(*a.StringValue, held)}
	case a.VersionValue != nil:
		return resourceapi.DeviceAttribute{VersionValue: in.str(*a.VersionValue, held)}
	}
	return a
}

// shared (in.mu held) returns the value table holds for v's shapeKey, or stores build() (equal to
// v, made of parts) for it when its estimated size (valueBytes and the key) fits the budget. Else,
// or when v cannot be encoded, it returns v as it is. Either way held references what is returned.
func shared[T any](in *Interner, table map[string]*entry, v T, valueBytes int, held *[]*entry, build func(parts *[]*entry) T) T {
	key, ok := shapeKey(v)
	if !ok {
		return v
	}
	if s, ok := take(table, key, held); ok {
		return s.(T)
	}
	size := entrySize(key, valueBytes)
	if !in.fits(size) {
		// Its own, still made of shared names and strings where they fit.
		return build(held)
	}
	var parts []*entry
	s := build(&parts)
	if !in.fits(size) { // the parts took the room
		*held = append(*held, parts...)
		return s
	}
	in.add(table, key, size, s, parts, held)
	return s
}

// shapeKey is the SHA-256 of a value's canonical encoding (JSON sorts map keys): equal keys are
// equal values, and a key is 32 bytes however large the value (a device list's JSON is kilobytes).
// Different spellings of one quantity ("1Gi", "1024Mi") get different keys and are merely not
// shared.
func shapeKey(m any) (string, bool) {
	data, err := json.Marshal(m)
	if err != nil {
		return "", false
	}
	sum := sha256.Sum256(data)
	return string(sum[:]), true
}

// attributes (in.mu held) returns a map equal to attrs: an identical one seen before, or a copy
// with interned names and values.
func (in *Interner) attributes(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, held *[]*entry) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	if attrs == nil {
		return nil
	}
	return shared(in, in.attrMaps, attrs, mapBytes(len(attrs), attrSlot), held, func(parts *[]*entry) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
		m := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(attrs))
		for n, a := range attrs {
			m[resourceapi.QualifiedName(*in.str(string(n), parts))] = in.attribute(a, parts)
		}
		return m
	})
}

// capacity (in.mu held) returns a map equal to caps, shared with every device of the same capacities.
func (in *Interner) capacity(caps map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, held *[]*entry) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	if caps == nil {
		return nil
	}
	return shared(in, in.capMaps, caps, mapBytes(len(caps), capacitySlot), held, func(parts *[]*entry) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
		m := make(map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, len(caps))
		for n, c := range caps {
			m[resourceapi.QualifiedName(*in.str(string(n), parts))] = c
		}
		return m
	})
}

// labels (in.mu held) returns a map equal to labels, shared with every object of the same labels.
func (in *Interner) labels(labels map[string]string, held *[]*entry) map[string]string {
	if labels == nil {
		return nil
	}
	return shared(in, in.labelMaps, labels, mapBytes(len(labels), labelSlot), held, func(parts *[]*entry) map[string]string {
		out := make(map[string]string, len(labels))
		for k, v := range labels {
			out[*in.str(k, parts)] = *in.str(v, parts)
		}
		return out
	})
}

// keys (in.mu held) returns a list equal to keys, shared with every object of the same.
func (in *Interner) keys(keys []string, held *[]*entry) []string {
	return shared(in, in.keyLists, keys, len(keys)*stringHeadSize, held, func(parts *[]*entry) []string {
		for i, k := range keys {
			keys[i] = *in.str(k, parts)
		}
		return keys
	})
}
