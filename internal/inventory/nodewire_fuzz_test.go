package inventory

import (
	"bytes"
	"io"
	"testing"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/watch"
	sjson "sigs.k8s.io/json"
)

// FuzzNodeEvents: whatever a watch of Nodes sends, decoding it never panics, and a node event
// that decodes whole as a Node is kept exactly as that Node would be: the fields nodeWire names
// are read as the API's types read them.
func FuzzNodeEvents(f *testing.F) {
	// Small seeds: the engine minimizes every input that finds new code, a run of the target
	// for each byte.
	f.Add([]byte(event("MODIFIED", nodeJSON(f, "unreachable"))))
	f.Add([]byte(`{"type":"ADDED","object":{"metadata":{"name":"n","resourceVersion":"7","labels":{"zone":"a","h":"n"}},"status":{"allocatable":{"gpu.example.com/gpu":"8"},"nodeInfo":{"kubeletVersion":"v1.37.2"}}}}`))
	all := func(v1.ResourceName) bool { return true }
	f.Fuzz(func(t *testing.T, data []byte) {
		in := NewInterner()
		d := newNodeEvents(io.NopCloser(bytes.NewReader(data)), func(w *nodeWire) *Node { return in.fromWire(w, all) })
		defer d.Close()
		typ, obj, err := d.Decode()
		var whole struct {
			Type   watch.EventType `json:"type"`
			Object v1.Node         `json:"object"`
		}
		if sjson.UnmarshalCaseSensitivePreserveInts(bytes.TrimSpace(data), &whole) != nil {
			return
		}
		switch whole.Type {
		case watch.Added, watch.Modified, watch.Deleted, watch.Bookmark:
		default:
			return
		}
		if err != nil {
			t.Fatalf("a %s event of a Node that decodes whole: %v", whole.Type, err)
		}
		got, ok := obj.(*Node)
		if !ok || typ != whole.Type {
			t.Fatalf("event %s of %T, want %s of a Node", typ, obj, whole.Type)
		}
		want := NewInterner().node(&whole.Object, all)
		if !sameNode(got, want) || got.ResourceVersion() != want.ResourceVersion() || got.KubeletVersion() != want.KubeletVersion() ||
			!apiequality.Semantic.DeepEqual(got.Full(), want.Full()) {
			t.Fatalf("kept %+v, decoded whole %+v", got.Full(), want.Full())
		}
	})
}
