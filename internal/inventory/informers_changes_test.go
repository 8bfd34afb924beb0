package inventory

import (
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	draclient "k8s.io/dynamic-resource-allocation/client"

	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// TestInformersTellChanges: against a real API server, the caches tell a change after the
// initial lists for each add, delete and update of a slice or a node, but not for a node's status
// update that leaves its labels as they were (a kubelet's heartbeat). Events of one kind arrive in
// order: a label change written after a heartbeat is told once, so the heartbeat was not.
func TestInformersTellChanges(t *testing.T) {
	srv := testapiserver.Start(t)
	ctx := t.Context()
	nodes := srv.Clientset.CoreV1().Nodes()
	dra := draclient.New(srv.Clientset)
	node, err := nodes.Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{"zone": "a"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var told atomic.Int64
	inf := NewInformers(srv.Clientset, 0, func() { told.Add(1) })
	inf.Start(ctx)
	waitTold := func(what string, want int64) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); told.Load() < want; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: told %d changes after a minute, want %d", what, told.Load(), want)
			}
		}
		time.Sleep(200 * time.Millisecond) // a change told twice would show by now
		if got := told.Load(); got != want {
			t.Fatalf("%s: told %d changes, want %d", what, got, want)
		}
	}
	for deadline := time.Now().Add(time.Minute); !inf.HasSynced(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("informers not synced after a minute")
		}
	}
	base := told.Load()
	if base < 1 {
		t.Fatal("the initial lists told no change")
	}
	node.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	if node, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	node.Labels["zone"] = "b"
	if node, err = nodes.Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitTold("a heartbeat, then a label changed", base+1)
	s := nodeSlice(t, "node-a", nodegroups.GroupSpec{})
	s.ObjectMeta = metav1.ObjectMeta{Name: s.Name}
	if _, err := dra.ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitTold("a slice created", base+2)
	if err := dra.ResourceSlices().Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitTold("a slice deleted", base+3)
	if err := nodes.Delete(ctx, node.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitTold("a node deleted", base+4)
	objs, err := inf.Published()
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.CompactNodes) != 0 || len(objs.CompactSlices) != 0 {
		t.Fatalf("after the deletes: %d nodes, %d slices cached", len(objs.CompactNodes), len(objs.CompactSlices))
	}
}
