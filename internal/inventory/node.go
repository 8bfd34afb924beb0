package inventory

import (
	"maps"
	"slices"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Node is a Node as the informers keep it: name, labels and the allocatable resources the webhook
// was told to keep. A v1.Node is 784 bytes before it holds anything, and every node's labels are a
// map of its own because the hostname label differs: over a kilobyte a node, all of it pointers
// the collector walks on every cycle. Here the labels whose value is the node's name (hostname)
// are kept as their keys, and nodes with the same other labels and kubelet share one nodeShape.
type Node struct {
	Meta
	// shape is nil for a node that names no more than its name.
	shape       *nodeShape
	Allocatable v1.ResourceList
	// held keeps the Interner's entries this node shares for as long as the node lives.
	held *holding
}

// nodeShape is what the nodes of a group have in common. Exported fields: its JSON is its key in
// the Interner's table.
type nodeShape struct {
	// Labels are the labels but for those in NameKeys.
	Labels map[string]string `json:"labels,omitempty"`
	// NameKeys are the keys of the labels whose value is the node's name.
	NameKeys []string `json:"nameKeys,omitempty"`
	// KubeletVersion is status.nodeInfo.kubeletVersion.
	KubeletVersion string `json:"kubeletVersion,omitempty"`
}

var noShape nodeShape

func (n *Node) shapeOf() *nodeShape {
	if n.shape == nil {
		return &noShape
	}
	return n.shape
}

// KubeletVersion is status.nodeInfo.kubeletVersion: what the node's kubelet can do
// (KubeletsBefore).
func (n *Node) KubeletVersion() string { return n.shapeOf().KubeletVersion }

// GetObjectKind makes Node a runtime.Object; it carries no type information.
func (n *Node) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject makes Node a runtime.Object; the labels are shared and read-only, as in the cache.
func (n *Node) DeepCopyObject() runtime.Object {
	return &Node{Meta: n.Meta, shape: n.shape, Allocatable: n.Allocatable.DeepCopy(), held: n.held}
}

// GetObjectMeta is what the informer's key function and reflector, and other readers of the
// node's metadata, read of the node.
func (n *Node) GetObjectMeta() metav1.Object {
	m := n.objectMeta(n.Labels())
	return &m
}

// Label returns the value of the label key.
func (n *Node) Label(key string) (string, bool) {
	sh := n.shapeOf()
	for _, k := range sh.NameKeys {
		if k == key {
			return n.Name, true
		}
	}
	v, ok := sh.Labels[key]
	return v, ok
}

// Labels returns every label, in a new map when some have the node's name as their value.
// Callers must not modify it.
func (n *Node) Labels() map[string]string {
	sh := n.shapeOf()
	if len(sh.NameKeys) == 0 {
		return sh.Labels
	}
	out := make(map[string]string, len(sh.Labels)+len(sh.NameKeys))
	maps.Copy(out, sh.Labels)
	for _, k := range sh.NameKeys {
		out[k] = n.Name
	}
	return out
}

// Full returns the node as the scheduler's allocator reads it: name and labels.
func (n *Node) Full() *v1.Node {
	return &v1.Node{ObjectMeta: n.objectMeta(n.Labels()),
		Status: v1.NodeStatus{Allocatable: n.Allocatable}}
}

// CompactNodes returns nodes as the informers keep them, with every allocatable resource.
func CompactNodes(in *Interner, nodes []*v1.Node) []*Node {
	out := make([]*Node, len(nodes))
	for i, n := range nodes {
		out[i] = in.node(n, func(v1.ResourceName) bool { return true })
	}
	return out
}

// node keeps of n what Node holds, of its allocatable resources those keep accepts. No check
// reads a node's uid: it is not kept (17 of a node's 41 bytes of strings).
func (in *Interner) node(n *v1.Node, keep func(v1.ResourceName) bool) *Node {
	out := &Node{Meta: newMeta(n.Name, "", n.ResourceVersion, 0, nil)}
	oneString(&out.Name, &out.ids)
	sh := nodeShape{KubeletVersion: n.Status.NodeInfo.KubeletVersion}
	for k, v := range n.Labels {
		if v == n.Name {
			sh.NameKeys = append(sh.NameKeys, k)
			continue
		}
		if sh.Labels == nil {
			sh.Labels = make(map[string]string, len(n.Labels))
		}
		sh.Labels[k] = v
	}
	slices.Sort(sh.NameKeys)
	if sh.Labels != nil || sh.NameKeys != nil || sh.KubeletVersion != "" {
		var held []*entry
		in.mu.Lock()
		out.shape = in.nodeShape(&sh, &held)
		out.held = in.hold(held, nil)
		in.mu.Unlock()
	}
	for name, q := range n.Status.Allocatable {
		if keep(name) {
			if out.Allocatable == nil {
				out.Allocatable = v1.ResourceList{}
			}
			out.Allocatable[name] = q
		}
	}
	return out
}

// nodeShape (in.mu held) returns a shape equal to sh, shared with every node of the same.
func (in *Interner) nodeShape(sh *nodeShape, held *[]*entry) *nodeShape {
	size := int(unsafe.Sizeof(*sh))
	return shared(in, in.nodeShapes, sh, size, held, func(parts *[]*entry) *nodeShape {
		out := &nodeShape{Labels: in.labels(sh.Labels, parts)}
		if sh.NameKeys != nil {
			out.NameKeys = in.keys(sh.NameKeys, parts)
		}
		if sh.KubeletVersion != "" {
			out.KubeletVersion = *in.str(sh.KubeletVersion, parts)
		}
		return out
	})
}

// sameNode reports whether two kept nodes look the same to the checks (labels and the allocatable
// resources kept); a status heartbeat changes neither.
func sameNode(a, b *Node) bool {
	sa, sb := a.shapeOf(), b.shapeOf()
	if a.Name != b.Name || len(sa.Labels) != len(sb.Labels) || len(sa.NameKeys) != len(sb.NameKeys) || len(a.Allocatable) != len(b.Allocatable) {
		return false
	}
	for k, v := range sa.Labels {
		if w, ok := sb.Labels[k]; !ok || w != v {
			return false
		}
	}
	for _, k := range sa.NameKeys {
		if v, ok := b.Label(k); !ok || v != a.Name {
			return false
		}
	}
	for k, q := range a.Allocatable {
		if r, ok := b.Allocatable[k]; !ok || q.Cmp(r) != 0 {
			return false
		}
	}
	return true
}
