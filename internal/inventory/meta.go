package inventory

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Meta is what the informers keep of a slice's or a node's metadata: what identifies it and its
// version. A metav1.ObjectMeta is 232 bytes, most of them fields nothing here reads (times,
// owners, finalizers, managedFields), for every node twice, its slice and itself: 2 MB at 5,000
// nodes that the collector scans on every cycle. Meta is 56.
type Meta struct {
	Name            string
	UID             types.UID
	ResourceVersion string
	Generation      int64
}

// objectMeta is m as an ObjectMeta with labels.
func (m *Meta) objectMeta(labels map[string]string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion, Generation: m.Generation, Labels: labels}
}

// metaOf keeps of o what Meta holds.
func metaOf(o *metav1.ObjectMeta) Meta {
	return Meta{Name: o.Name, UID: o.UID, ResourceVersion: o.ResourceVersion, Generation: o.Generation}
}

// oneString makes prefix and the strings strs point at one new string (each distinct value once)
// and returns the prefix's part of it. Decoded, each string is an allocation of its own (a node's
// name, uid and resourceVersion are three), in spans the decode's garbage shares: the kept strings
// would pin those spans and leave the heap fragmented after the initial lists.
func oneString(prefix []byte, strs ...*string) string {
	n := len(prefix)
	for _, s := range strs {
		n += len(*s)
	}
	if n == 0 {
		return ""
	}
	var b strings.Builder
	b.Grow(n)
	b.Write(prefix)
	var buf [8]int
	offs := buf[:0]
	for i, s := range strs {
		off := -1
		for j := range i {
			if *strs[j] == *s {
				off = offs[j]
				break
			}
		}
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
