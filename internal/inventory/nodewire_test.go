package inventory

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"
)

// nodeJSON is a Node of testdata/nodes as the API server sends it: kubelet, a node a kubelet
// reports with its images and conditions; unreachable, one of the scale fleet's nodes after the
// controller-manager tainted it.
func nodeJSON(t testing.TB, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "nodes", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSpace(raw)
}

func event(typ string, object []byte) string {
	return `{"type":"` + typ + `","object":` + string(object) + "}\n"
}

// decodeEvents decodes a watch response of the given events until its end or an error.
func decodeEvents(keep []v1.ResourceName, events ...string) ([]watch.Event, error) {
	in := NewInterner()
	d := newNodeEvents(io.NopCloser(strings.NewReader(strings.Join(events, ""))), func(w *nodeWire) *Node {
		return in.fromWire(w, keepOnly(keep))
	})
	defer d.Close()
	var out []watch.Event
	for {
		typ, obj, err := d.Decode()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, watch.Event{Type: typ, Object: obj})
	}
}

// TestNodeWireKeepsWhatNodeKeeps: a Node decoded from a watch event's JSON is kept as the same
// Node decoded whole would be (name, resourceVersion, labels, kubelet version, the allocatable
// resources asked for), and nothing else of it.
func TestNodeWireKeepsWhatNodeKeeps(t *testing.T) {
	for _, tc := range []struct {
		node      string
		keep      []v1.ResourceName
		wantAlloc []v1.ResourceName
	}{
		{node: "kubelet"},
		{node: "kubelet", keep: []v1.ResourceName{"gpu.example.com/gpu", "example.com/gpu"}, wantAlloc: []v1.ResourceName{"gpu.example.com/gpu"}},
		{node: "unreachable", keep: []v1.ResourceName{"gpu.example.com/gpu", "cpu"}, wantAlloc: []v1.ResourceName{"cpu"}},
	} {
		t.Run(tc.node, func(t *testing.T) {
			raw := nodeJSON(t, tc.node)
			full := &v1.Node{}
			if err := json.Unmarshal(raw, full); err != nil {
				t.Fatal(err)
			}
			want := NewInterner().node(full, keepOnly(tc.keep))
			events, err := decodeEvents(tc.keep, event("MODIFIED", raw))
			if err != nil || len(events) != 1 {
				t.Fatalf("%d events, error %v; want 1", len(events), err)
			}
			got, ok := events[0].Object.(*Node)
			if !ok || events[0].Type != watch.Modified {
				t.Fatalf("event %s of %T, want MODIFIED of a Node", events[0].Type, events[0].Object)
			}
			if got.Name != full.Name || got.ResourceVersion() != full.ResourceVersion || got.KubeletVersion() != full.Status.NodeInfo.KubeletVersion {
				t.Errorf("kept %s at %s, kubelet %q; want %s at %s, kubelet %q", got.Name, got.ResourceVersion(), got.KubeletVersion(),
					full.Name, full.ResourceVersion, full.Status.NodeInfo.KubeletVersion)
			}
			if !apiequality.Semantic.DeepEqual(got.Full(), want.Full()) || !sameNode(got, want) {
				t.Errorf("kept %+v, decoded whole %+v", got.Full(), want.Full())
			}
			if len(got.Allocatable) != len(tc.wantAlloc) {
				t.Errorf("allocatable %v, want only %v", got.Allocatable, tc.wantAlloc)
			}
			for _, name := range tc.wantAlloc {
				if q, ok := got.Allocatable[name]; !ok || !q.Equal(full.Status.Allocatable[name]) {
					t.Errorf("allocatable %s: %v, want %v", name, q, full.Status.Allocatable[name])
				}
			}
		})
	}
}

// TestNodeEvents: every event type a watch sends decodes to what the reflector expects (an
// ERROR's Status to the error it handles); anything else ends the watch with an error that says
// what was wrong.
func TestNodeEvents(t *testing.T) {
	node := nodeJSON(t, "unreachable")
	expired := []byte(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 5 (120)","reason":"Expired","code":410}`)
	bookmark := []byte(`{"kind":"Node","apiVersion":"v1","metadata":{"resourceVersion":"120","creationTimestamp":null}}`)
	for _, tc := range []struct {
		name    string
		events  []string
		want    []watch.EventType
		wantErr string
	}{
		{name: "every node event", events: []string{event("ADDED", node), event("MODIFIED", node), event("BOOKMARK", bookmark), event("DELETED", node)},
			want: []watch.EventType{watch.Added, watch.Modified, watch.Bookmark, watch.Deleted}},
		{name: "expired", events: []string{event("ADDED", node), event("ERROR", expired)}, want: []watch.EventType{watch.Added, watch.Error}},
		{name: "unknown type", events: []string{event("SYNC", node)}, wantErr: `event type "SYNC"`},
		{name: "labels not a map", events: []string{event("ADDED", []byte(`{"metadata":{"name":"n","labels":"zone=a"}}`))}, wantErr: "decode an event"},
		{name: "allocatable not a quantity", events: []string{event("ADDED", []byte(`{"metadata":{"name":"n"},"status":{"allocatable":{"cpu":"lots"}}}`))}, wantErr: "decode an event"},
		{name: "cut short", events: []string{event("ADDED", node)[:100]}, wantErr: "unexpected EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events, err := decodeEvents(nil, tc.events...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []watch.EventType
			for _, e := range events {
				got = append(got, e.Type)
				switch e.Type {
				case watch.Error:
					if err := apierrors.FromObject(e.Object); !apierrors.IsResourceExpired(err) {
						t.Errorf("ERROR event: %v, want the resourceVersion expired", err)
					}
				case watch.Bookmark:
					if n := e.Object.(*Node); n.ResourceVersion() != "120" {
						t.Errorf("bookmark at %q, want 120", n.ResourceVersion())
					}
				default:
					if n := e.Object.(*Node); n.Name != "scale-node-01234" {
						t.Errorf("%s event of node %q", e.Type, n.Name)
					}
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("events %v, want %v", got, tc.want)
			}
		})
	}
}

// repeated reads frame over and over: a watch that never ends.
type repeated struct {
	frame []byte
	off   int
}

func (r *repeated) Read(p []byte) (int, error) {
	n := copy(p, r.frame[r.off:])
	r.off = (r.off + n) % len(r.frame)
	return n, nil
}

// typedNodeEvents decodes a watch of Nodes as client-go's typed watch does: each event, then its
// Node decoded whole.
func typedNodeEvents(body io.ReadCloser) watch.Decoder {
	info, _ := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	frames := info.StreamSerializer.Framer.NewFrameReader(body)
	return restclientwatch.NewDecoder(streaming.NewDecoder(frames, info.StreamSerializer.Serializer),
		scheme.Codecs.WithoutConversion().DecoderToVersion(info.Serializer, v1.SchemeGroupVersion))
}

// allocatedPerEvent is the heap allocated for each of n events decode reads, after a first one.
func allocatedPerEvent(t *testing.T, n int, decode func() error) uint64 {
	t.Helper()
	if err := decode(); err != nil {
		t.Fatal(err)
	}
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	for range n {
		if err := decode(); err != nil {
			t.Fatal(err)
		}
	}
	goruntime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(n)
}

// TestNodeEventGarbageBounded: an event of a Node a kubelet reports (its images, conditions,
// managedFields) is decoded and kept allocating less than its own size, where decoding it whole
// allocates several times that, on every write to every node.
func TestNodeEventGarbageBounded(t *testing.T) {
	frame := []byte(event("MODIFIED", nodeJSON(t, "kubelet")))
	keep := keepOnly([]v1.ResourceName{"gpu.example.com/gpu"})
	in := NewInterner()
	wire := newNodeEvents(io.NopCloser(&repeated{frame: frame}), func(w *nodeWire) *Node { return in.fromWire(w, keep) })
	typed := typedNodeEvents(io.NopCloser(&repeated{frame: frame}))
	wireBytes := allocatedPerEvent(t, 200, func() error { _, _, err := wire.Decode(); return err })
	typedBytes := allocatedPerEvent(t, 200, func() error {
		_, obj, err := typed.Decode()
		if err == nil {
			_ = in.node(obj.(*v1.Node), keep)
		}
		return err
	})
	if wireBytes >= uint64(len(frame)) || typedBytes < uint64(len(frame)) {
		t.Errorf("an event of %d bytes: %d bytes allocated to keep its node (decoded whole, %d); want less than the event, and the whole decode more",
			len(frame), wireBytes, typedBytes)
	}
}

// BenchmarkNodeWatchEvent: one MODIFIED event of a Node, decoded and kept as a Node. typed is how
// client-go's typed watch reads it (the event, then the Node decoded whole, then kept);
// wire decodes only what is kept.
func BenchmarkNodeWatchEvent(b *testing.B) {
	keep := keepOnly([]v1.ResourceName{"gpu.example.com/gpu"})
	for _, node := range []string{"kubelet", "unreachable"} {
		frame := []byte(event("MODIFIED", nodeJSON(b, node)))
		b.Run(node+"/typed", func(b *testing.B) {
			in := NewInterner()
			d := typedNodeEvents(io.NopCloser(&repeated{frame: frame}))
			b.ReportAllocs()
			for b.Loop() {
				_, obj, err := d.Decode()
				if err != nil {
					b.Fatal(err)
				}
				_ = in.node(obj.(*v1.Node), keep)
			}
		})
		b.Run(node+"/wire", func(b *testing.B) {
			in := NewInterner()
			d := newNodeEvents(io.NopCloser(&repeated{frame: frame}), func(w *nodeWire) *Node { return in.fromWire(w, keep) })
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := d.Decode(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
