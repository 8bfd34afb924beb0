package inventory

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNodeTransform: of a Node only name, labels and the allocatable resources asked for stay.
func TestNodeTransform(t *testing.T) {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"a": "b"}, Annotations: map[string]string{"big": "x"}},
		Status: v1.NodeStatus{
			Allocatable: v1.ResourceList{"cpu": resource.MustParse("8"), "gpu.example.com/gpu": resource.MustParse("4")},
			Images:      []v1.ContainerImage{{Names: []string{"busybox"}}},
		},
	}
	for _, tc := range []struct {
		keep []v1.ResourceName
		want v1.ResourceList
	}{
		{keep: nil, want: nil},
		{keep: []v1.ResourceName{"gpu.example.com/gpu", "example.com/gpu"}, want: v1.ResourceList{"gpu.example.com/gpu": resource.MustParse("4")}},
	} {
		out, err := NewInterner().nodeLabelsOnly(tc.keep)(node)
		if err != nil {
			t.Fatal(err)
		}
		n := out.(*Node)
		if l, _ := n.Label("a"); n.Name != "n1" || l != "b" || len(n.Labels()) != 1 || n.Full().Annotations != nil {
			t.Errorf("kept more than name and labels: %+v", n)
		}
		if len(n.Allocatable) != len(tc.want) || !n.Allocatable["gpu.example.com/gpu"].Equal(tc.want["gpu.example.com/gpu"]) {
			t.Errorf("keep %v: allocatable %v, want %v", tc.keep, n.Allocatable, tc.want)
		}
	}
}
