package feasibility

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-dra/gpu-dra/driver/plugin"
	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility/feasibilitytest"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// transformed passes objects through the informers' transforms, as the webhook caches them.
func transformed(t testing.TB, st *inventory.Objects) *inventory.Objects {
	t.Helper()
	in := inventory.NewInterner()
	out := &inventory.Objects{CompactNodes: inventory.CompactNodes(in, st.Nodes)}
	for _, s := range st.Slices {
		o, err := in.TransformSlice(s)
		if err != nil {
			t.Fatal(err)
		}
		out.CompactSlices = append(out.CompactSlices, o.(*inventory.Slice))
	}
	for _, c := range st.Classes {
		o, err := inventory.TransformClass(c)
		if err != nil {
			t.Fatal(err)
		}
		out.Classes = append(out.Classes, o.(*resourceapi.DeviceClass))
	}
	return out
}

// TestTransformedInventoryAnswersTheSame: the view over the informers' transformed objects
// (stripped metadata, shared maps) gives every claim of testdata/claims.yaml the answer it gives
// over the objects as inventory.
func TestTransformedInventoryAnswersTheSame(t *testing.T) {
	ctx := context.Background()
	cases := feasibilitytest.LoadCases[claimCase](t, "claims.yaml")
	st := feasibilitytest.Cluster()
	checker := celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema())
	plain, shared := New(st, checker), New(transformed(t, st), checker)
	plain.timeout, shared.timeout = time.Minute, time.Minute
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			spec := tc.Spec.DeepCopy()
			resourceversion.Default(spec)
			want, err := plain.Unsatisfiable(ctx, "default", spec)
			if err != nil {
				t.Fatal(err)
			}
			got, err := shared.Unsatisfiable(ctx, "default", spec)
			if err != nil {
				t.Fatal(err)
			}
			if got != want || want != tc.Message {
				t.Fatalf("transformed objects: %q, as published: %q, want %q", got, want, tc.Message)
			}
		})
	}
}

// simulatedFleet is nodes nodes of the plugin's simulated GPUs (8 each, three models), as the API server
// returns them: decoded from JSON, so no two objects share anything.
func simulatedFleet(b testing.TB, nodes int) *inventory.Objects {
	b.Helper()
	groups := []nodegroups.GroupSpec{{}, {Model: "H200-SXM-141GB"}, {Model: "L4"}}
	st := &inventory.Objects{Classes: feasibilitytest.Classes()}
	for i := range nodes {
		name := fmt.Sprintf("node-%05d", i)
		res, err := plugin.Resources(context.Background(), name, simulated.New(name, groups[i%len(groups)]), plugin.CountersInOwnSlices)
		if err != nil {
			b.Fatal(err)
		}
		s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-gpu.example.com-x7k2p", UID: types.UID(fmt.Sprintf("0b7a4d8e-1f0c-4f2e-8c1a-%012x", i)), ResourceVersion: "12345"},
			Spec: resourceapi.ResourceSliceSpec{Driver: feasibilitytest.Driver, NodeName: &name, Pool: resourceapi.ResourcePool{Name: name, ResourceSliceCount: 1},
				Devices: res.Pools[name].Slices[0].Devices}}
		data, err := json.Marshal(s)
		if err != nil {
			b.Fatal(err)
		}
		decoded := &resourceapi.ResourceSlice{}
		if err := json.Unmarshal(data, decoded); err != nil {
			b.Fatal(err)
		}
		st.Slices = append(st.Slices, decoded)
		st.Nodes = append(st.Nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(fmt.Sprintf("3f1c9a2e-7d4b-4a1e-9b2c-%012x", i)), ResourceVersion: "12345",
			Labels: map[string]string{v1.LabelHostname: name, v1.LabelArchStable: "amd64", "example.com/group": fmt.Sprint(i % len(groups))}}})
	}
	return st
}

// heap is what the heap holds after a collection: bytes in use, and the part of them the
// collector scans for pointers (its marking work; pointer-free objects are not scanned).
type heap struct{ inUse, scan uint64 }

func heapNow() heap {
	runtime.GC()
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/scan/heap:bytes"}}
	metrics.Read(s)
	return heap{s[0].Value.Uint64(), s[1].Value.Uint64()}
}

// perNode reports what the heap grew by from a to b, per node.
func perNode(b *testing.B, a, z heap, nodes int, what string) {
	b.ReportMetric(float64(z.inUse-a.inUse)/float64(nodes), what+"-B/node")
	b.ReportMetric(float64(z.scan-a.scan)/float64(nodes), what+"-scan-B/node")
}

// BenchmarkInventoryMemory reports the heap a node of 8 GPUs costs the webhook: its Node and slice
// as decoded, as the informers keep them after the transforms, and the View's index over those;
// of the last two also the bytes the collector scans, which its marking time follows.
//
//	go test -run '^$' -bench BenchmarkInventoryMemory -benchtime 3x ./internal/analysis/feasibility
func BenchmarkInventoryMemory(b *testing.B) {
	const nodes = 1000
	checker := celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema())
	spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "g", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: "gpu", Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.example.com"].model == "L4"`}}}}}}}}
	resourceversion.Default(spec)
	for b.Loop() {
		start := heapNow()
		st := simulatedFleet(b, nodes)
		decoded := heapNow()
		shared := transformed(b, st)
		st.Slices, st.Nodes = nil, nil
		kept := heapNow()
		view := New(shared, checker)
		if msg, err := view.Unsatisfiable(context.Background(), "default", spec); err != nil || msg != "" {
			b.Fatalf("L4 GPU unsatisfiable: %q, %v", msg, err)
		}
		indexed := heapNow()
		b.ReportMetric(float64(decoded.inUse-start.inUse)/nodes, "decoded-B/node")
		perNode(b, start, kept, nodes, "cached")
		perNode(b, kept, indexed, nodes, "view")
		runtime.KeepAlive(view)
		runtime.KeepAlive(shared)
	}
}

// keptPerNode bounds the heap the informers keep of a node of 8 GPUs: its slice and its Node as
// transformed, with their share of the Interner's tables (548 bytes, and some room).
const keptPerNode = 580

// TestInventoryPerNodeBounded: what the webhook keeps of a node stays under keptPerNode bytes.
// Slices and Nodes each kept a metav1.ObjectMeta (232 bytes, most of them fields nothing reads):
// 1.6 KB a node, 8 MB at 5,000 nodes; and then a decoded allocation for each of their strings, a
// list of held entries each, and their uuids as written: 1.15 KB. A slice kept its whole spec, the
// fields few slices set among them, and its node's name behind a pointer of its own: 679 bytes;
// and both kept uids nothing reads: 596.
func TestInventoryPerNodeBounded(t *testing.T) {
	const nodes = 1000
	st := simulatedFleet(t, nodes)
	start := heapNow()
	kept := transformed(t, st)
	end := heapNow()
	runtime.KeepAlive(st)
	runtime.KeepAlive(kept)
	if per := (end.inUse - start.inUse) / nodes; per > keptPerNode {
		t.Errorf("a node of 8 GPUs keeps %d bytes, want at most %d", per, keptPerNode)
	} else {
		t.Logf("a node of 8 GPUs keeps %d bytes", per)
	}
}

// indexedPerNode bounds the heap the View's index of the published state (a Snapshot, before any
// question) keeps of a node of 8 GPUs: the numbering of its devices and the lists that tie it to
// its slice (47 bytes, and some room).
const indexedPerNode = 60

// TestViewIndexPerNodeBounded: what the View's index keeps of a node stays under indexedPerNode
// bytes. Per node and per slice lists of their own and a map entry per node name were over 300
// bytes a node; a list of every node's devices besides the list of its slices, 92.
func TestViewIndexPerNodeBounded(t *testing.T) {
	const nodes = 1000
	kept := transformed(t, simulatedFleet(t, nodes))
	view := New(kept, celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema()))
	start := heapNow()
	s, err := view.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	end := heapNow()
	runtime.KeepAlive(s)
	if per := (end.inUse - start.inUse) / nodes; per > indexedPerNode {
		t.Errorf("the index keeps %d bytes a node of 8 GPUs, want at most %d", per, indexedPerNode)
	} else {
		t.Logf("the index keeps %d bytes a node of 8 GPUs", per)
	}
}
