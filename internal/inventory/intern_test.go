package inventory

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/allocs"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// uniqueSlice is slice i of a driver whose every slice differs from the others (a model string,
// serial numbers and a memory size of its own), its devices differing in a uuid too: nothing of it
// but the device names and attribute names repeats across slices.
func uniqueSlice(i, devices int) *resourceapi.ResourceSlice {
	node := fmt.Sprintf("node-%05d", i)
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu", UID: "u", ResourceVersion: strconv.Itoa(i)},
		Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.example.com", NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}}}
	for j := range devices {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: fmt.Sprintf("gpu-%d", j),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"model":          {StringValue: ptr.To(fmt.Sprintf("model-of-slice-%d", i))},
				"index":          {IntValue: ptr.To(int64(j))},
				"serial":         {IntValue: ptr.To(int64(1000 + i*devices + j))},
				"driverVersion":  {VersionValue: ptr.To(fmt.Sprintf("1.%d.0", i))},
				"uuid":           {StringValue: ptr.To(fmt.Sprintf("GPU-%d-%d", i, j))},
				"productName":    {StringValue: ptr.To(fmt.Sprintf("Example GPU %d", i))},
				"multiInstances": {BoolValue: ptr.To(true)},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: resource.MustParse(fmt.Sprintf("%dMi", 1000+i))},
				"cores":  {Value: resource.MustParse(strconv.Itoa(100 + i))},
			}})
	}
	return s
}

// drained waits for the collector to release what no live object holds and reports whether the
// tables came to want (entries, bytes).
func drained(in *Interner, wantEntries, wantBytes int) (entries, bytes int, ok bool) {
	for range 200 {
		runtime.GC()
		if entries, bytes = in.usage(); entries == wantEntries && bytes == wantBytes {
			return entries, bytes, true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return entries, bytes, false
}

// TestInternerHeapBoundedByBudget: 2,000 slices with device lists of their own, kept as the
// informer keeps them, hold no more heap through the Interner (its tables and what each slice
// holds of them) than its budget and a few words a slice.
func TestInternerHeapBoundedByBudget(t *testing.T) {
	const n, devices, budget = 2000, 8, 1 << 20
	var in *Interner
	build := func() []*Slice {
		in = NewInterner(WithByteBudget(budget))
		out := make([]*Slice, n)
		for i := range n {
			out[i] = in.compact(uniqueSlice(i, devices))
		}
		return out
	}
	// The same slices sharing the same values, without the Interner.
	values := allocs.Retained(func() any {
		kept := build()
		for i, s := range kept {
			kept[i] = &Slice{Meta: s.Meta, Spec: s.Spec}
		}
		in = nil
		return kept
	})
	kept := allocs.Retained(func() any { return build() })
	// What a slice may hold of the Interner besides its budget: its holding and the holding's
	// cleanup, and a reference to its driver and to its list or to each part of its devices.
	perSlice := int64(64 + 64 + 2*8*(2+3*devices))
	entries, bytes := in.usage()
	t.Logf("%d slices: %.2f MiB of values, %.2f MiB more with the Interner; tables %d entries, %.2f MiB estimated", n,
		float64(values)/(1<<20), float64(kept-values)/(1<<20), entries, float64(bytes)/(1<<20))
	if bytes > budget {
		t.Errorf("tables hold %d bytes, budget %d", bytes, budget)
	}
	if limit := budget + n*perSlice; kept-values > limit {
		t.Errorf("the Interner holds %d bytes, want at most %d (budget %d + %d a slice)", kept-values, limit, budget, perSlice)
	}
}

// sliceInformer is a slice informer wired as NewInformers wires it, over a list of initial and a
// watch the test drives.
func sliceInformer(t *testing.T, in *Interner, initial []*resourceapi.ResourceSlice, w watch.Interface) cache.SharedIndexInformer {
	t.Helper()
	list := func(_ context.Context, o metav1.ListOptions) (*resourceapi.ResourceSliceList, error) {
		start, _ := strconv.Atoi(o.Continue)
		end := min(start+int(o.Limit), len(initial))
		page := &resourceapi.ResourceSliceList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}
		for _, s := range initial[start:end] {
			page.Items = append(page.Items, *s)
		}
		if end < len(initial) {
			page.Continue = strconv.Itoa(end)
		}
		return page, nil
	}
	inf := cache.NewSharedIndexInformer(in.sliceListWatch(list, func(context.Context, metav1.ListOptions) (watch.Interface, error) { return w, nil }), &Slice{}, 0, nil)
	go inf.RunWithContext(t.Context())
	if !cache.WaitForCacheSync(t.Context().Done(), inf.HasSynced) {
		t.Fatal("slice informer not synced")
	}
	return inf
}

// waitStored waits until the informer's store holds n slices.
func waitStored(t *testing.T, inf cache.SharedIndexInformer, n int) {
	t.Helper()
	for range 1000 {
		if len(inf.GetStore().List()) == n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("store holds %d slices, want %d", len(inf.GetStore().List()), n)
}

// TestInternerDrainsWhenSlicesGo: slices listed in pages, added, changed and deleted through the
// informer's paths leave nothing in the tables once every one is deleted.
func TestInternerDrainsWhenSlicesGo(t *testing.T) {
	in := NewInterner()
	var initial []*resourceapi.ResourceSlice
	for i := range 2*listPageSize + 10 {
		initial = append(initial, uniqueSlice(i, 8))
	}
	w := watch.NewFake()
	inf := sliceInformer(t, in, initial, w)
	added := uniqueSlice(len(initial), 8)
	w.Add(added)
	changed := uniqueSlice(1000, 8)
	changed.ObjectMeta = initial[0].ObjectMeta
	w.Modify(changed)
	waitStored(t, inf, len(initial)+1)
	if entries, _ := in.usage(); entries == 0 {
		t.Fatal("nothing interned")
	}
	for _, s := range append(initial, added) {
		w.Delete(s)
	}
	waitStored(t, inf, 0)
	if entries, bytes, ok := drained(in, 0, 0); !ok {
		t.Errorf("every slice deleted: tables hold %d entries, %d bytes", entries, bytes)
	}
}

// TestInternerUpdatesDoNotGrow: a slice updated again and again with new values leaves the tables
// holding what its latest version holds.
func TestInternerUpdatesDoNotGrow(t *testing.T) {
	in := NewInterner()
	other := in.compact(nodeSlice(t, "other", nodegroups.GroupSpec{}))
	kept := in.compact(uniqueSlice(0, 8))
	wantEntries, wantBytes := in.usage()
	for i := range 1000 {
		s := uniqueSlice(i+1, 8)
		s.ObjectMeta = metav1.ObjectMeta{Name: kept.Name, ResourceVersion: strconv.Itoa(i + 2)}
		kept = in.compact(s)
	}
	kept = in.compact(uniqueSlice(0, 8))
	if entries, bytes, ok := drained(in, wantEntries, wantBytes); !ok {
		t.Errorf("after 1,000 updates: tables hold %d entries, %d bytes; want %d, %d as after the first", entries, bytes, wantEntries, wantBytes)
	}
	runtime.KeepAlive(other)
	runtime.KeepAlive(kept)
}

// TestInternerSharesIdenticalSlices: 1,000 nodes of one group share one device list, its attribute
// and capacity maps, and the tables hold what one node's slice needs.
func TestInternerSharesIdenticalSlices(t *testing.T) {
	in := NewInterner()
	first := in.compact(nodeSlice(t, "node-0", nodegroups.GroupSpec{}))
	wantEntries, wantBytes := in.usage()
	kept := []*Slice{first}
	for i := 1; i < 1000; i++ {
		s := in.compact(nodeSlice(t, fmt.Sprintf("node-%d", i), nodegroups.GroupSpec{}))
		if &s.Spec.Devices[0] != &first.Spec.Devices[0] {
			t.Fatalf("slice %d: device list not shared", i)
		}
		if uuid, _ := s.Attribute(0, "uuid"); *uuid.StringValue == *must(first.Attribute(0, "uuid")).StringValue {
			t.Fatalf("slice %d: uuid of another node", i)
		}
		kept = append(kept, s)
	}
	if entries, bytes := in.usage(); entries != wantEntries || bytes != wantBytes {
		t.Errorf("1,000 identical nodes: %d entries, %d bytes; want %d, %d as for one", entries, bytes, wantEntries, wantBytes)
	}
	// Nodes of a new group share its maps with each other once the list is no longer shared.
	small := NewInterner(WithByteBudget(wantBytes - 1))
	a := small.compact(nodeSlice(t, "a", nodegroups.GroupSpec{}))
	b := small.compact(nodeSlice(t, "b", nodegroups.GroupSpec{}))
	if &a.Spec.Devices[0] == &b.Spec.Devices[0] || mapPointer(a.Spec.Devices[0].Capacity) != mapPointer(b.Spec.Devices[0].Capacity) {
		t.Error("with no room for the list: lists shared, or capacity maps not")
	}
	runtime.KeepAlive(kept)
}

// TestInternerConcurrentUse: slices and nodes transformed from several goroutines while the
// collector releases those dropped leave the tables empty once none is kept.
func TestInternerConcurrentUse(t *testing.T) {
	in := NewInterner(WithByteBudget(256 << 10))
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 300 {
				_ = in.compact(uniqueSlice(g*1000+i%50, 4))
				_ = in.compact(nodeSlice(t, fmt.Sprintf("node-%d", i), nodegroups.GroupSpec{}))
				_ = in.node(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"zone": strconv.Itoa(i % 7), "h": "n"}}}, keepOnly(nil))
				if i%100 == 0 {
					runtime.GC()
				}
			}
		}()
	}
	for range 4 {
		<-done
	}
	if entries, bytes, ok := drained(in, 0, 0); !ok {
		t.Errorf("nothing kept: tables hold %d entries, %d bytes", entries, bytes)
	}
}

func must[T any](v T, ok bool) T {
	if !ok {
		panic("missing")
	}
	return v
}

// BenchmarkTransformSlice transforms slices as an informer does, keeping the results as its store
// would: nodes of one group (every slice takes the list the first one left) and slices of their
// own (every one new to the tables: the tables start empty every len(inputs) slices).
func BenchmarkTransformSlice(b *testing.B) {
	for _, tc := range []struct {
		name   string
		mk     func(i int) *resourceapi.ResourceSlice
		shared bool
	}{
		{"group", func(i int) *resourceapi.ResourceSlice {
			return nodeSlice(b, fmt.Sprintf("node-%d", i), nodegroups.GroupSpec{})
		}, true},
		{"unique", func(i int) *resourceapi.ResourceSlice { return uniqueSlice(i, 8) }, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			inputs := make([]*resourceapi.ResourceSlice, 1000)
			for i := range inputs {
				inputs[i] = tc.mk(i)
			}
			store := make([]any, len(inputs))
			in := NewInterner()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				k := i % len(inputs)
				if k == 0 && !tc.shared {
					in = NewInterner()
				}
				store[k], _ = in.TransformSlice(inputs[k])
			}
		})
	}
}

// TestInternerSharesHoldings: the slices (with the same labels) and the nodes of one group share
// one holding (one cleanup) while any of them lives; a slice with other labels holds another;
// once all are gone the tables drain, and objects made afterwards share a new holding that
// drains too.
func TestInternerSharesHoldings(t *testing.T) {
	in := NewInterner()
	node := func(name string) *v1.Node {
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1",
			Labels: map[string]string{v1.LabelHostname: name, "zone": "a"}}}
	}
	for round := range 2 {
		// The first of a group holds what it alone uses yet, in a holding of its own.
		first := in.compact(nodeSlice(t, "node-9", nodegroups.GroupSpec{}))
		a, b := in.compact(nodeSlice(t, "node-0", nodegroups.GroupSpec{})), in.compact(nodeSlice(t, "node-1", nodegroups.GroupSpec{}))
		if a.held == nil || a.held != b.held {
			t.Errorf("round %d: slices of one group hold %p and %p, want one holding", round, a.held, b.held)
		}
		labelled := nodeSlice(t, "node-2", nodegroups.GroupSpec{})
		labelled.Labels = map[string]string{"example.com/rack": "r2"}
		c := in.compact(labelled)
		if c.held == a.held {
			t.Errorf("round %d: a slice with other labels shares the group's holding", round)
		}
		if got := c.Labels()["example.com/rack"]; got != "r2" || a.Labels()["example.com/rack"] != "r1" {
			t.Errorf("round %d: labels %v and %v, want rack r2 and r1", round, c.Labels(), a.Labels())
		}
		firstNode := in.node(node("node-9"), keepAll)
		na, nb := in.node(node("node-0"), keepAll), in.node(node("node-1"), keepAll)
		if na.held == nil || na.held != nb.held {
			t.Errorf("round %d: nodes of one group hold %p and %p, want one holding", round, na.held, nb.held)
		}
		// The first slice goes: what the other still uses stays in the tables.
		entries, _ := in.usage()
		runtime.KeepAlive(a)
		a = nil
		if got, _, _ := drained(in, entries, -1); got == 0 {
			t.Fatalf("round %d: one slice of two gone, the tables are empty", round)
		}
		runtime.KeepAlive(b)
		runtime.KeepAlive(c)
		runtime.KeepAlive(na)
		runtime.KeepAlive(nb)
		runtime.KeepAlive(first)
		runtime.KeepAlive(firstNode)
		first, firstNode, b, c, na, nb = nil, nil, nil, nil, nil, nil
		if entries, bytes, ok := drained(in, 0, 0); !ok {
			t.Fatalf("round %d: every object gone, tables hold %d entries, %d bytes", round, entries, bytes)
		}
	}
}
