package inventory

import (
	"encoding/binary"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Meta is what the informers keep of a slice's or a node's metadata: what identifies it and its
// version. A metav1.ObjectMeta is 232 bytes, most of them fields nothing here reads (times,
// owners, finalizers, managedFields), for every node twice, its slice and itself: 2 MB at 5,000
// nodes that the collector scans on every cycle. Meta is 40: the uid and the resourceVersion,
// which only the informers' machinery reads, are one string, with what the object keeps of its
// own after them (a slice's own attributes).
type Meta struct {
	Name string
	// ids is the uid's length and flags (a uvarint, see newMeta), the uid, the resourceVersion
	// and the rest.
	ids        string
	Generation int64
}

// Flags of the uid's length in Meta.ids.
const (
	// idsPackedUID: the uid is a UUID kept as its 16 bytes. The API server's uids are UUIDs.
	idsPackedUID = 1 << iota
	// idsRest: the resourceVersion's length follows it (a uvarint), and the rest comes after
	// the resourceVersion; else the resourceVersion is all that follows the uid.
	idsRest
	idsFlags = iota
)

// newMeta is the Meta of these.
func newMeta(name string, uid types.UID, resourceVersion string, generation int64, rest []byte) Meta {
	if uid == "" && resourceVersion == "" && len(rest) == 0 {
		return Meta{Name: name, Generation: generation}
	}
	ids := make([]byte, 0, 2*binary.MaxVarintLen64+len(uid)+len(resourceVersion)+len(rest))
	var flags uint64
	if len(rest) > 0 {
		flags |= idsRest
	}
	if prefix, ok := uuidTail(string(uid)); ok && prefix == 0 {
		ids = packUUID(binary.AppendUvarint(ids, uuidBytes<<idsFlags|flags|idsPackedUID), string(uid))
	} else {
		ids = append(binary.AppendUvarint(ids, uint64(len(uid))<<idsFlags|flags), uid...)
	}
	if len(rest) > 0 {
		ids = binary.AppendUvarint(ids, uint64(len(resourceVersion)))
	}
	ids = append(append(ids, resourceVersion...), rest...)
	return Meta{Name: name, ids: string(ids), Generation: generation}
}

// uvarint reads the uvarint at the start of s and returns it and the rest of s.
func uvarint(s string) (int, string) {
	n, k := binary.Uvarint([]byte(s[:min(len(s), binary.MaxVarintLen64)]))
	return int(n), s[k:]
}

// split returns the uid, the resourceVersion and the rest.
func (m *Meta) split() (types.UID, string, string) {
	uid, packed, rv, rest := m.fields()
	if packed {
		uid = string(unpackUUID(nil, uid))
	}
	return types.UID(uid), rv, rest
}

// fields returns the uid as kept (packed: its 16 bytes), the resourceVersion and the rest,
// without allocating: the rest (a slice's own attributes) is read for every device a check
// looks at.
func (m *Meta) fields() (uid string, packed bool, rv, rest string) {
	if m.ids == "" {
		return "", false, "", ""
	}
	n, s := uvarint(m.ids)
	uid, s = s[:n>>idsFlags], s[n>>idsFlags:]
	if n&idsRest == 0 {
		return uid, n&idsPackedUID != 0, s, ""
	}
	k, s := uvarint(s)
	return uid, n&idsPackedUID != 0, s[:k], s[k:]
}

// sameUID: m and o are of objects with the same uid; read without unpacking it.
func (m *Meta) sameUID(o *Meta) bool {
	a, packedA, _, _ := m.fields()
	b, packedB, _, _ := o.fields()
	return a == b && packedA == packedB
}

// GetName is the object's name: with GetNamespace, what the caches sort their objects by
// (reflected.Named).
func (m *Meta) GetName() string { return m.Name }

// GetNamespace is "": slices and nodes are cluster-scoped.
func (m *Meta) GetNamespace() string { return "" }

// UID is the object's metadata.uid.
func (m *Meta) UID() types.UID {
	uid, _, _ := m.split()
	return uid
}

// ResourceVersion is the object's metadata.resourceVersion.
func (m *Meta) ResourceVersion() string {
	_, rv, _ := m.split()
	return rv
}

// objectMeta is m as an ObjectMeta with labels.
func (m *Meta) objectMeta(labels map[string]string) metav1.ObjectMeta {
	uid, rv, _ := m.split()
	return metav1.ObjectMeta{Name: m.Name, UID: uid, ResourceVersion: rv, Generation: m.Generation, Labels: labels}
}

// metaOf keeps of o what Meta holds.
func metaOf(o *metav1.ObjectMeta) Meta {
	return newMeta(o.Name, o.UID, o.ResourceVersion, o.Generation, nil)
}

// oneString makes the strings strs point at one new string, each string's bytes once (a slice's
// pool and node name are most often the start of its name). Decoded, each string is an allocation
// of its own (a node's name, uid and resourceVersion are three), in spans the decode's garbage
// shares: the kept strings would pin those spans and leave the heap fragmented after the initial
// lists.
func oneString(strs ...*string) {
	n := 0
	for i, s := range strs {
		if !slices.ContainsFunc(strs[:i], func(t *string) bool { return strings.Contains(*t, *s) }) {
			n += len(*s)
		}
	}
	if n == 0 {
		return
	}
	var b strings.Builder
	// Grown once, the builder's bytes never move: what is written so far can be searched.
	b.Grow(n)
	var buf [8]int
	offs := buf[:0]
	for _, s := range strs {
		off := strings.Index(b.String(), *s)
		if off < 0 {
			off = b.Len()
			b.WriteString(*s)
		}
		offs = append(offs, off)
	}
	text := b.String()
	for i, s := range strs {
		*s = text[offs[i] : offs[i]+len(*s)]
	}
}
