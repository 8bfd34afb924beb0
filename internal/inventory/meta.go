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
// which only the informers' machinery reads, are one string.
type Meta struct {
	Name string
	// ids is the uid's length (a uvarint, see newMeta), the uid and the resourceVersion.
	ids        string
	Generation int64
}

// newMeta is the Meta of these.
func newMeta(name string, uid types.UID, resourceVersion string, generation int64) Meta {
	if uid == "" && resourceVersion == "" {
		return Meta{Name: name, Generation: generation}
	}
	ids := make([]byte, 0, binary.MaxVarintLen64+len(uid)+len(resourceVersion))
	// The API server's uids are UUIDs: those are kept as their 16 bytes, marked by the length's
	// lowest bit.
	if prefix, ok := uuidTail(string(uid)); ok && prefix == 0 {
		ids = packUUID(binary.AppendUvarint(ids, uuidBytes<<1|1), string(uid))
	} else {
		ids = append(binary.AppendUvarint(ids, uint64(len(uid))<<1), uid...)
	}
	ids = append(ids, resourceVersion...)
	return Meta{Name: name, ids: string(ids), Generation: generation}
}

// split returns the uid and the resourceVersion.
func (m *Meta) split() (types.UID, string) {
	if m.ids == "" {
		return "", ""
	}
	n, k := binary.Uvarint([]byte(m.ids[:min(len(m.ids), binary.MaxVarintLen64)]))
	end := k + int(n>>1)
	if n&1 == 1 {
		return types.UID(unpackUUID(nil, m.ids[k:end])), m.ids[end:]
	}
	return types.UID(m.ids[k:end]), m.ids[end:]
}

// UID is the object's metadata.uid.
func (m *Meta) UID() types.UID {
	uid, _ := m.split()
	return uid
}

// ResourceVersion is the object's metadata.resourceVersion.
func (m *Meta) ResourceVersion() string {
	_, rv := m.split()
	return rv
}

// objectMeta is m as an ObjectMeta with labels.
func (m *Meta) objectMeta(labels map[string]string) metav1.ObjectMeta {
	uid, rv := m.split()
	return metav1.ObjectMeta{Name: m.Name, UID: uid, ResourceVersion: rv, Generation: m.Generation, Labels: labels}
}

// metaOf keeps of o what Meta holds.
func metaOf(o *metav1.ObjectMeta) Meta {
	return newMeta(o.Name, o.UID, o.ResourceVersion, o.Generation)
}

// oneString makes prefix and the strings strs point at one new string (each string's bytes once:
// a slice's pool and node name are most often the start of its name) and returns the prefix's part
// of it. Decoded, each string is an allocation of its own (a node's name, uid and resourceVersion
// are three), in spans the decode's garbage shares: the kept strings would pin those spans and
// leave the heap fragmented after the initial lists.
func oneString(prefix []byte, strs ...*string) string {
	n := len(prefix)
	for i, s := range strs {
		if !slices.ContainsFunc(strs[:i], func(t *string) bool { return strings.Contains(*t, *s) }) {
			n += len(*s)
		}
	}
	if n == 0 {
		return ""
	}
	var b strings.Builder
	// Grown once, the builder's bytes never move: what is written so far can be searched.
	b.Grow(n)
	b.Write(prefix)
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
	return text[:len(prefix)]
}
