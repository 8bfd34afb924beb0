package scale

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// TestCountWrites: every write to a Node or a ResourceSlice after the count starts is counted
// once, and none before it.
func TestCountWrites(t *testing.T) {
	s := testapiserver.Start(t)
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	node := func(name string) *corev1.Node { return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }
	if _, err := cs.CoreV1().Nodes().Create(ctx, node("before"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c, err := countWrites(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	n, err := cs.CoreV1().Nodes().Create(ctx, node("after"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels = map[string]string{"changed": "yes"}
	if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Nodes().Delete(ctx, "before", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	slice := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "slice"},
		Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.example.com", NodeName: ptr.To("after"),
			Pool: resourceapi.ResourcePool{Name: "after", ResourceSliceCount: 1}},
	}
	if _, err := cs.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := writes{Nodes: 3, Slices: 1}
	deadline := time.Now().Add(30 * time.Second)
	for c.Writes() != want && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := c.Stop(); got != want {
		t.Errorf("writes: got %v, want %v", got, want)
	}
}

// TestWriteNodes: the writer writes each node's Ready condition in turn, every write reaching the
// API server (as countWrites sees it), and reports the first write that failed, naming the node.
func TestWriteNodes(t *testing.T) {
	s := testapiserver.Start(t)
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName(i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := countWrites(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	w := writeNodes(ctx, cs, 3, 50)
	time.Sleep(500 * time.Millisecond)
	n, err := w.stop()
	if err != nil || n < 3 {
		t.Fatalf("%d writes, error %v; want at least one a node and no error", n, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for c.Writes().Nodes != n && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := c.Writes().Nodes; got != n {
		t.Errorf("the API server saw %d Node writes, the writer made %d", got, n)
	}
	for i := range 3 {
		node, err := cs.CoreV1().Nodes().Get(ctx, NodeName(i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(node.Status.Conditions) != 1 || node.Status.Conditions[0].Type != corev1.NodeReady {
			t.Errorf("node %s: conditions %+v, want the Ready condition written", node.Name, node.Status.Conditions)
		}
	}
	w = writeNodes(ctx, cs, 4, 100)
	time.Sleep(200 * time.Millisecond)
	if _, err := w.stop(); err == nil || !strings.Contains(err.Error(), NodeName(3)) {
		t.Errorf("writing a node that does not exist: error %v, want one naming %s", err, NodeName(3))
	}
}
