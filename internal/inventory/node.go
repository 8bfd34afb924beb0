package inventory

import (
	"maps"
	"slices"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Node is a Node as the informers keep it: name, labels and the allocatable resources the webhook
// was told to keep. A v1.Node is 784 bytes before it holds anything, and every node's labels are a
// map of its own because the hostname label differs: over a kilobyte a node, all of it pointers
// the collector walks on every cycle. Here the labels whose value is the node's name (hostname)
// are kept as their keys, and nodes with the same other labels share one map.
type Node struct {
	Meta
	// labels are the labels but for those in nameKeys, shared between nodes.
	labels map[string]string
	// nameKeys are the keys of the labels whose value is the node's name.
	nameKeys    []string
	Allocatable v1.ResourceList
	// KubeletVersion is status.nodeInfo.kubeletVersion, interned: what the node's kubelet can do
	// (KubeletsBefore).
	KubeletVersion string
	// held keeps the Interner's entries this node shares for as long as the node lives.
	held *holding
}

// GetObjectKind makes Node a runtime.Object; it carries no type information.
func (n *Node) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject makes Node a runtime.Object; the labels are shared and read-only, as in the cache.
func (n *Node) DeepCopyObject() runtime.Object {
	return &Node{Meta: n.Meta, labels: n.labels, nameKeys: n.nameKeys, Allocatable: n.Allocatable.DeepCopy(), KubeletVersion: n.KubeletVersion, held: n.held}
}

// GetObjectMeta is what the informer's key function and reflector, and other readers of the
// node's metadata, read of the node.
func (n *Node) GetObjectMeta() metav1.Object {
	m := n.objectMeta(n.Labels())
	return &m
}

// Label returns the value of the label key.
func (n *Node) Label(key string) (string, bool) {
	for _, k := range n.nameKeys {
		if k == key {
			return n.Name, true
		}
	}
	v, ok := n.labels[key]
	return v, ok
}

// Labels returns every label, in a new map when some have the node's name as their value.
// Callers must not modify it.
func (n *Node) Labels() map[string]string {
	if len(n.nameKeys) == 0 {
		return n.labels
	}
	out := make(map[string]string, len(n.labels)+len(n.nameKeys))
	maps.Copy(out, n.labels)
	for _, k := range n.nameKeys {
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

// node keeps of n what Node holds, of its allocatable resources those keep accepts.
func (in *Interner) node(n *v1.Node, keep func(v1.ResourceName) bool) *Node {
	out := &Node{Meta: Meta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion}}
	var others map[string]string
	for k, v := range n.Labels {
		if v == n.Name {
			out.nameKeys = append(out.nameKeys, k)
			continue
		}
		if others == nil {
			others = make(map[string]string, len(n.Labels))
		}
		others[k] = v
	}
	slices.Sort(out.nameKeys)
	var held []*entry
	in.mu.Lock()
	out.labels = in.labels(others, &held)
	if out.nameKeys != nil {
		out.nameKeys = in.keys(out.nameKeys, &held)
	}
	if v := n.Status.NodeInfo.KubeletVersion; v != "" {
		out.KubeletVersion = *in.str(v, &held)
	}
	out.held = in.hold(held)
	in.mu.Unlock()
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

// sameNode reports whether two kept nodes look the same to the checks (labels and the allocatable
// resources kept); a status heartbeat changes neither.
func sameNode(a, b *Node) bool {
	if a.Name != b.Name || len(a.labels) != len(b.labels) || len(a.nameKeys) != len(b.nameKeys) || len(a.Allocatable) != len(b.Allocatable) {
		return false
	}
	for k, v := range a.labels {
		if w, ok := b.labels[k]; !ok || w != v {
			return false
		}
	}
	for _, k := range a.nameKeys {
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
