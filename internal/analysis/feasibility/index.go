package feasibility

import (
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gpu-dra/gpu-dra/internal/inventory"
)

// flat is a list of lists in one array: list i is items[start[i]:start[i+1]]. The snapshot keeps
// a list for every node (its devices, its slices) and every slice (its nodes), most of them a few
// elements long: as slices of their own they would be a header and an allocation each, and up to
// twice their length where append grew them.
type flat[T any] struct {
	start []int32
	items []T
}

// of is list i. Callers must not modify it.
func (f *flat[T]) of(i int) []T { return f.items[f.start[i]:f.start[i+1]:f.start[i+1]] }

// flatFrom lays out lists of the lengths counts: it returns the lists, empty, and each one's next
// free place, for fill.
func flatFrom[T any](counts []int32) (flat[T], []int32) {
	f := flat[T]{start: make([]int32, len(counts)+1)}
	for i, c := range counts {
		f.start[i+1] = f.start[i] + c
	}
	f.items = make([]T, f.start[len(counts)])
	return f, slices.Clone(f.start[:len(counts)])
}

// fill appends v to list i.
func (f *flat[T]) fill(next []int32, i int, v T) {
	f.items[next[i]] = v
	next[i]++
}

// group returns, for n groups, the indexes i of each group g (groupOf[i] == g), in order.
func group(n int, groupOf []int32) flat[int32] {
	counts := make([]int32, n)
	for _, g := range groupOf {
		counts[g]++
	}
	f, next := flatFrom[int32](counts)
	for i, g := range groupOf {
		f.fill(next, int(g), int32(i))
	}
	return f
}

// indexNodes numbers the nodes, by name: those listed and those the slices name.
func (s *Snapshot) indexNodes(nodes []*inventory.Node) {
	s.nodes = slices.Clone(nodes)
	byName := func(a, b *inventory.Node) int { return strings.Compare(a.Name, b.Name) }
	// Stable: of two of one name, the first listed is kept.
	slices.SortStableFunc(s.nodes, byName)
	s.nodes = slices.CompactFunc(s.nodes, func(a, b *inventory.Node) bool { return a.Name == b.Name })
	// A slice may name a node the cache has not seen (offline inventories list no nodes).
	var unlisted []*inventory.Node
	for _, sl := range s.slices {
		if sl.Spec.NodeName != "" {
			if _, ok := s.NodeIndex(sl.Spec.NodeName); !ok {
				unlisted = append(unlisted, &inventory.Node{Meta: inventory.Meta{Name: sl.Spec.NodeName}})
			}
		}
	}
	if unlisted != nil {
		s.nodes = append(s.nodes, unlisted...)
		slices.SortStableFunc(s.nodes, byName)
		s.nodes = slices.CompactFunc(s.nodes, func(a, b *inventory.Node) bool { return a.Name == b.Name })
	}
	s.nodes = slices.Clip(s.nodes)
}

// indexDevices numbers the devices of the slices and records which nodes reach each slice, and
// what makes devices of equal attributes not interchangeable (partitions, incomplete pools).
func (s *Snapshot) indexDevices() {
	s.taints = []string{""}
	taintIndex := map[string]int32{"": 0}
	var fullNodes []*v1.Node
	poolSlices := map[string]int{}
	poolWant := map[string]int64{}
	users := make([][]int, len(s.slices))
	sliceCounts := make([]int32, len(s.slices))
	nodeSliceCounts := make([]int32, len(s.nodes))
	devices := 0
	for si, sl := range s.slices {
		pool := sl.Spec.Driver + "/" + sl.Spec.Pool.Name
		poolSlices[pool]++
		poolWant[pool] = sl.Spec.Pool.ResourceSliceCount
		users[si] = s.sliceUsers(sl, &fullNodes)
		sliceCounts[si] = int32(len(users[si]))
		for _, u := range users[si] {
			nodeSliceCounts[u]++
		}
		devices += len(sl.Spec.Devices)
	}
	s.devices = make([]device, 0, devices)
	s.sliceFirst = make([]int32, len(s.slices))
	var nextSlice, nextNode []int32
	s.sliceNodes, nextNode = flatFrom[int](sliceCounts)
	s.nodeSlices, nextSlice = flatFrom[int32](nodeSliceCounts)
	for si, sl := range s.slices {
		first := len(s.devices)
		s.sliceFirst[si] = int32(first)
		if s.addDevices(si, sl, taintIndex) {
			s.exact, s.anyCounters = true, true
			if s.counterSample == nil {
				s.counterSample = []*resourceapi.ResourceSlice{sl.Full()}
			}
		}
		for _, u := range users[si] {
			s.sliceNodes.fill(nextNode, si, u)
			s.nodeSlices.fill(nextSlice, u, int32(si))
		}
	}
	for pool, n := range poolSlices {
		if int64(n) != poolWant[pool] {
			s.exact = true
		}
	}
}

// sliceUsers are the nodes that can use the devices of sl. fullNodes are the nodes as the
// allocator reads them, made at the first slice that needs them.
func (s *Snapshot) sliceUsers(sl *inventory.Slice, fullNodes *[]*v1.Node) []int {
	if sl.Spec.NodeName != "" {
		n, _ := s.NodeIndex(sl.Spec.NodeName)
		return []int{n}
	}
	if *fullNodes == nil {
		// As the allocator reads them, for this build only: kept, they would be the kilobyte a
		// node that inventory.Node saves.
		*fullNodes = make([]*v1.Node, len(s.nodes))
		for i, n := range s.nodes {
			(*fullNodes)[i] = n.Full()
		}
	}
	var users []int
	for i, n := range *fullNodes {
		ok, err := structured.NodeMatches(baseFeatures, n, "", ptrTrue(sl.Spec.AllNodes()), sl.Spec.NodeSelector())
		if err == nil && (ok || sl.Spec.PerDeviceNodeSelection() != nil) {
			users = append(users, i)
		}
	}
	if sl.Spec.PerDeviceNodeSelection() != nil {
		s.exact = true
	}
	return users
}

// addDevices numbers the devices of slice si; counters reports whether the slice has counter sets
// or a device consuming them.
func (s *Snapshot) addDevices(si int, sl *inventory.Slice, taintIndex map[string]int32) (counters bool) {
	counters = len(sl.Spec.SharedCounters()) > 0
	for i := range sl.Spec.Devices {
		d := &sl.Spec.Devices[i]
		counters = counters || len(d.ConsumesCounters) > 0
		if ptrTrue(d.AllowMultipleAllocations) {
			s.anyShared = true
			s.sharedDrivers[sl.Spec.Driver] = true
		}
		key := taintKey(d.Taints)
		taint, ok := taintIndex[key]
		if !ok {
			taint = int32(len(s.taints))
			taintIndex[key] = taint
			s.taints = append(s.taints, key)
		}
		if taint != 0 && s.deviceTaints == nil {
			s.deviceTaints = make([]int32, cap(s.devices)) // room for every device (indexDevices)
		}
		if s.deviceTaints != nil {
			s.deviceTaints[len(s.devices)] = taint
		}
		s.devices = append(s.devices, device{in: int32(si)})
	}
	return counters
}
