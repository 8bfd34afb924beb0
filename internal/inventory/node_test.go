package inventory

import (
	"maps"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func keepAll(v1.ResourceName) bool { return true }

// TestNodeKept: a kept node gives back its name, every label and the allocatable resources kept;
// nodes that differ only in their hostname share one labels map.
func TestNodeKept(t *testing.T) {
	in := NewInterner()
	node := func(name string) *v1.Node {
		uid := types.UID("uid-" + name)
		if name == "node-b" { // as the API server makes them
			uid = "6f5d8c6e-1f0c-7f2e-5c1a-3b2c1d0e9f8a"
		}
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid, ResourceVersion: "7",
			Labels: map[string]string{v1.LabelHostname: name, "zone": "a", "self": name}},
			Status: v1.NodeStatus{Allocatable: v1.ResourceList{"example.com/gpu": resource.MustParse("2"), v1.ResourceCPU: resource.MustParse("8")}}}
	}
	a, b := node("node-a"), node("node-b")
	ka, kb := in.node(a, keepAll), in.node(b, func(n v1.ResourceName) bool { return n == "example.com/gpu" })
	for _, tc := range []struct {
		kept *Node
		from *v1.Node
		res  int
	}{{ka, a, 2}, {kb, b, 1}} {
		if !maps.Equal(tc.kept.Labels(), tc.from.Labels) {
			t.Errorf("%s: labels %v, want %v", tc.from.Name, tc.kept.Labels(), tc.from.Labels)
		}
		for k, v := range tc.from.Labels {
			if got, ok := tc.kept.Label(k); !ok || got != v {
				t.Errorf("%s: label %s = %q, %t; want %q", tc.from.Name, k, got, ok, v)
			}
		}
		meta := tc.kept.GetObjectMeta()
		if !maps.Equal(meta.GetLabels(), tc.from.Labels) {
			t.Errorf("%s: GetLabels %v, want %v", tc.from.Name, meta.GetLabels(), tc.from.Labels)
		}
		if _, ok := tc.kept.Label("missing"); ok {
			t.Errorf("%s: a label it does not have", tc.from.Name)
		}
		full := tc.kept.Full()
		if full.Name != tc.from.Name || full.UID != "" || !maps.Equal(full.Labels, tc.from.Labels) || len(full.Status.Allocatable) != tc.res {
			t.Errorf("%s: Full() = %+v", tc.from.Name, full)
		}
		cp := tc.kept.DeepCopyObject().(*Node)
		if !maps.Equal(cp.Labels(), tc.from.Labels) || cp.Name != tc.from.Name || len(cp.Allocatable) != tc.res {
			t.Errorf("%s: deep copy %+v", tc.from.Name, cp)
		}
	}
	if reflect.ValueOf(ka.shape.Labels).Pointer() != reflect.ValueOf(kb.shape.Labels).Pointer() || len(ka.shape.Labels) != 1 {
		t.Errorf("nodes differing only in name-valued labels keep %v and %v, not one map of the zone", ka.shape.Labels, kb.shape.Labels)
	}
}

func TestSameNode(t *testing.T) {
	base := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"a": "1", v1.LabelHostname: "n"}},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{"example.com/gpu": resource.MustParse("2")}}}
	for _, tc := range []struct {
		name   string
		change func(*v1.Node)
		same   bool
	}{
		{"heartbeat", func(n *v1.Node) { n.ResourceVersion = "2" }, true},
		{"allocatable respelled", func(n *v1.Node) { n.Status.Allocatable["example.com/gpu"] = resource.MustParse("2000m") }, true},
		{"label value", func(n *v1.Node) { n.Labels["a"] = "2" }, false},
		{"label added", func(n *v1.Node) { n.Labels["b"] = "1" }, false},
		{"label renamed", func(n *v1.Node) { delete(n.Labels, "a"); n.Labels["b"] = "1" }, false},
		{"hostname label gone", func(n *v1.Node) { delete(n.Labels, v1.LabelHostname) }, false},
		{"hostname label other", func(n *v1.Node) { n.Labels[v1.LabelHostname] = "m" }, false},
		{"name-valued label renamed", func(n *v1.Node) { delete(n.Labels, v1.LabelHostname); n.Labels["host"] = "n" }, false},
		{"allocatable", func(n *v1.Node) { n.Status.Allocatable["example.com/gpu"] = resource.MustParse("0") }, false},
		{"allocatable gone", func(n *v1.Node) { n.Status.Allocatable = nil }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := NewInterner()
			n := base.DeepCopy()
			tc.change(n)
			if got := sameNode(in.node(base, keepAll), in.node(n, keepAll)); got != tc.same {
				t.Errorf("sameNode = %t, want %t", got, tc.same)
			}
		})
	}
}
