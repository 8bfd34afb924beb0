// Package fleet is what a cluster's DRA devices are doing right now: for every published device
// the attributes people ask about (model, memory), its taints (published in the ResourceSlice or
// added by a DeviceTaintRule), the claims and pods holding it with their shares and consumed
// capacity, and the counters its partitions have used. It is computed from ResourceSlices,
// ResourceClaims and DeviceTaintRules converted to resource.k8s.io/v1, and it also yields what the
// scheduler hands its allocator (the slices with the rules' taints applied and the AllocatedState),
// so that "why does my claim wait" is answered against the scheduler's own view.
//
// Reading those objects from a cluster or a file is the caller's job; whether a claim could be
// allocated is internal/analysis/feasibility's.
package deviceusage

import (
	"cmp"
	"reflect"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/structured"
)

// Input is what Build reads, every object converted to resource.k8s.io/v1.
type Input struct {
	// Slices as their drivers published them: DeviceTaintRules are applied by Build.
	Slices []*resourceapi.ResourceSlice
	Claims []*resourceapi.ResourceClaim
	// Kept are more claims, as a cache keeps them (see Claim).
	Kept       []*Claim
	TaintRules []*resourceapi.DeviceTaintRule
	// BusyPoolsOnly restricts the fleet (Slices, Devices, CounterSets) to the pools in which
	// something may stand in a claim's way: an allocated, tainted or shared device, or one that
	// needs more of a counter than its pool has. Every device of another pool is free and
	// unhindered, and Device returns nil for it. For callers that look for obstacles in a large
	// cluster, where listing every free device costs a kilobyte each.
	BusyPoolsOnly bool
	// Previous is a fleet built before, which is kept meanwhile (the webhook rebuilds its fleet as
	// claims change, and answers from the last one until the next is built). Its devices that
	// nothing changed for, the same published device of the same slice object held by the same
	// results of the same claim objects, and consuming no counters, are the new fleet's too: a
	// rebuild after a few claims changed makes a few devices, not 40,000, and the two fleets
	// held at once share the rest. Neither fleet's caller may modify its devices then.
	Previous *Fleet
}

// State is the one-word summary of a device's use.
type State string

const (
	// StateFree: no claim holds the device and it can be allocated.
	StateFree State = "free"
	// StateAllocated: a claim holds the device exclusively.
	StateAllocated State = "allocated"
	// StateShared: the device allows several allocations and holds at least one.
	StateShared State = "shared"
	// StateBlocked: no claim holds the device, but allocated devices of the same counter set
	// (partitions of one GPU) left too little of a counter for it.
	StateBlocked State = "blocked"
)

// Node names what a device that is not local to one node is reachable from.
const (
	AllNodes      = "<all nodes>"
	SelectedNodes = "<selected nodes>"
)

// Device is one published device and its use. Its Source and Kind are shared with the other
// devices of its slice that are alike, and are read-only. They are embedded so that their fields
// read, and print and decode as JSON, as the device's own.
type Device struct {
	*Source
	Name string `json:"name"`
	*Kind
	Taints []Taint `json:"taints,omitempty"`
	// Healthy is false when a taint keeps new claims off the device (NoSchedule, NoExecute), or
	// when the caller found a Fault.
	Healthy bool `json:"healthy"`
	// Fault is a fault reported for the device outside its ResourceSlice ("kind: message"), set
	// by the caller: the gpu-dra plugin's simulated faults, which a cluster that drops device
	// taints never sees as taints.
	Fault       string       `json:"fault,omitempty"`
	State       State        `json:"state"`
	Allocations []Allocation `json:"allocations,omitempty"`
	// Consumed is the capacity the allocations of a shared device consume together.
	Consumed map[resourceapi.QualifiedName]resource.Quantity `json:"consumed,omitempty"`
	// CountersShort are the counter sets that have too little left for the device (StateBlocked).
	CountersShort []string `json:"countersShort,omitempty"`

	// device is the device as published (DeviceTaintRules applied).
	device *resourceapi.Device
}

// Source is the driver and pool that publish a device. The devices of a slice share one: a fleet
// is kept for long (the webhook keeps two of 40,000 devices), and these are 32 bytes a device.
type Source struct {
	Driver string `json:"driver"`
	Pool   string `json:"pool"`
	// slice publishes the devices (DeviceTaintRules applied).
	slice *resourceapi.ResourceSlice
}

// Kind is where a device is and what it is, shared by the devices of a slice that are alike
// (all, mostly): 56 bytes a device otherwise.
type Kind struct {
	// Node is the node the device is local to, or AllNodes or SelectedNodes.
	Node string `json:"node"`
	// Model is the device's "model" attribute in its driver's domain, "" when it has none.
	Model string `json:"model,omitempty"`
	// Memory is the device's "memory" capacity in its driver's domain. Memory and Capacity are
	// shared between devices of one shape.
	Memory   *resource.Quantity                              `json:"memory,omitempty"`
	Capacity map[resourceapi.QualifiedName]resource.Quantity `json:"capacity,omitempty"`
	// Shared: the device allows several allocations at once (allowMultipleAllocations).
	Shared bool `json:"shared,omitempty"`
}

// same: k and o are alike, their capacities the same values (capacities hands out one copy per
// shape, so a device's are its neighbour's when they are alike).
func (k *Kind) same(o *Kind) bool {
	return k.Node == o.Node && k.Model == o.Model && k.Memory == o.Memory && k.Shared == o.Shared &&
		reflect.ValueOf(k.Capacity).UnsafePointer() == reflect.ValueOf(o.Capacity).UnsafePointer()
}

// ID is the device's identity as the allocator knows it.
func (d *Device) ID() structured.DeviceID {
	return structured.MakeDeviceID(d.Driver, d.Pool, d.Name)
}

// Published returns the device as published, with the DeviceTaintRules' taints added.
func (d *Device) Published() *resourceapi.Device { return d.device }

// Taint is a device taint and where it comes from.
type Taint struct {
	Key       string                        `json:"key"`
	Value     string                        `json:"value,omitempty"`
	Effect    resourceapi.DeviceTaintEffect `json:"effect"`
	TimeAdded *metav1.Time                  `json:"timeAdded,omitempty"`
	// Rule names the DeviceTaintRule that adds the taint; empty when the driver published it.
	Rule string `json:"rule,omitempty"`
}

// Allocation is one claim's hold on a device.
type Allocation struct {
	// Claim is namespace/name.
	Claim   string `json:"claim"`
	Request string `json:"request"`
	// Pods are the pods (namespace/name) the claim is reserved for.
	Pods []string `json:"pods,omitempty"`
	// Consumers are other reservedFor entries, as resource/name.
	Consumers        []string                                        `json:"consumers,omitempty"`
	ShareID          string                                          `json:"shareID,omitempty"`
	ConsumedCapacity map[resourceapi.QualifiedName]resource.Quantity `json:"consumedCapacity,omitempty"`
	// AdminAccess allocations monitor a device without holding it.
	AdminAccess bool `json:"adminAccess,omitempty"`
	// Device is set only for allocations of devices no slice publishes (Fleet.Unpublished).
	Device string `json:"device,omitempty"`

	// from is the claim the allocation is of (Device.sameHolders).
	from *Claim
}

// Holder names the claim and its pods, for messages: "default/c (pod default/p)".
func (a Allocation) Holder() string {
	s := a.Claim
	if len(a.Pods) > 0 {
		s += " (pod " + joinMax(a.Pods, 3) + ")"
	}
	return s
}

// Fleet is every published device and its use.
type Fleet struct {
	// Devices ordered by node, driver, pool, slice name and position in the slice.
	Devices []*Device
	// Unpublished are allocations of devices no slice publishes (a driver that went away).
	Unpublished []Allocation
	// Pending are the claims (namespace/name) without an allocation.
	Pending     []string
	CounterSets []*CounterSet
	// Slices are the published slices with the DeviceTaintRules' taints added, as the
	// scheduler's allocator sees them.
	Slices []*resourceapi.ResourceSlice

	// byID are the positions in Devices ordered by ID, for Device: 4 bytes a device where a map
	// would take 60, for as long as the fleet is kept (the webhook keeps two of 40,000 devices).
	byID  []int32
	state structured.AllocatedState
}

// Device returns the device with id, or nil.
func (f *Fleet) Device(id structured.DeviceID) *Device {
	return f.DeviceNamed(id.Driver.String(), id.Pool.String(), id.Device.String())
}

// DeviceNamed returns the device name of the driver's pool, or nil: Device for a caller that has
// the names, which need not be made a DeviceID (unique.Make of each) to be looked up.
func (f *Fleet) DeviceNamed(driver, pool, name string) *Device {
	i, found := slices.BinarySearchFunc(f.byID, 0, func(at int32, _ int) int {
		d := f.Devices[at]
		return cmp.Or(cmp.Compare(d.Driver, driver), cmp.Compare(d.Pool, pool), cmp.Compare(d.Name, name))
	})
	if !found {
		return nil
	}
	return f.Devices[f.byID[i]]
}

// AllocatedState is what the scheduler passes to its allocator for the current claims: devices
// held exclusively, shares of shared devices and the capacity they consume. Admin access does not
// hold a device. The caller must not modify it.
func (f *Fleet) AllocatedState() structured.AllocatedState { return f.state }

// Build computes the fleet from in.
func Build(in Input) *Fleet {
	f := &Fleet{}
	var rules map[structured.DeviceID][]string
	f.Slices, rules = applyTaintRules(in.Slices, in.TaintRules)
	claims := sortedClaims(claimsOf(in))
	if in.BusyPoolsOnly {
		busy := busyPools(f.Slices, claims, rules)
		f.Slices = slices.DeleteFunc(slices.Clone(f.Slices), func(sl *resourceapi.ResourceSlice) bool {
			return !busy[poolKey{sl.Spec.Driver, sl.Spec.Pool.Name}]
		})
	}
	places, byID := f.placeDevices()
	held := f.addAllocations(claims, len(places), byID)
	made := f.addDevices(places, held, claims, rules, in.Previous)
	sortStable(f.Devices, func(a, b *Device) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Driver, b.Driver), cmp.Compare(a.Pool, b.Pool),
			cmp.Compare(a.slice.Name, b.slice.Name))
	})
	// Only devices consuming counters can be short of them, and those are all made anew.
	f.addCounters()
	for _, d := range made {
		switch {
		case len(d.Holders()) > 0 && d.Shared:
			d.State = StateShared
		case len(d.Holders()) > 0:
			d.State = StateAllocated
		case len(d.CountersShort) > 0:
			d.State = StateBlocked
		default:
			d.State = StateFree
		}
	}
	f.indexByID()
	return f
}

// place is device index of slice.
type place struct {
	slice *resourceapi.ResourceSlice
	index int
}

// placeDevices lists the devices of the fleet's slices, in the order of the slices, and numbers
// them by ID. Of two devices of one ID, as two slices of one pool publish while the driver
// replaces a slice, the allocator uses the first: so does the fleet.
func (f *Fleet) placeDevices() ([]place, map[structured.DeviceID]int32) {
	n := 0
	for _, sl := range f.Slices {
		n += len(sl.Spec.Devices)
	}
	places := make([]place, 0, n)
	byID := make(map[structured.DeviceID]int32, n)
	for _, sl := range f.Slices {
		for i := range sl.Spec.Devices {
			id := structured.MakeDeviceID(sl.Spec.Driver, sl.Spec.Pool.Name, sl.Spec.Devices[i].Name)
			if _, dup := byID[id]; dup {
				continue
			}
			byID[id] = int32(len(places))
			places = append(places, place{slice: sl, index: i})
		}
	}
	return places, byID
}

// addDevices lists the fleet's devices, in the order of places, with their allocations held:
// those of prev that nothing changed for, and new ones, which it returns.
func (f *Fleet) addDevices(places []place, held holdings, claims []*Claim, rules map[structured.DeviceID][]string, prev *Fleet) (made []*Device) {
	f.Devices = make([]*Device, 0, len(places))
	caps := newCapacities()
	names := &namer{claims: claims, last: -1}
	var source *Source
	var kind *Kind
	for p, pl := range places {
		sl, d := pl.slice, &pl.slice.Spec.Devices[pl.index]
		hs := held.of(p)
		if pd := prev.unchanged(sl, d, hs, claims); pd != nil {
			f.Devices = append(f.Devices, pd)
			continue
		}
		if source == nil || source.slice != sl {
			source = &Source{Driver: sl.Spec.Driver, Pool: sl.Spec.Pool.Name, slice: sl}
		}
		k := Kind{Node: sliceNode(sl), Shared: d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations}
		if sl.Spec.PerDeviceNodeSelection != nil && *sl.Spec.PerDeviceNodeSelection {
			k.Node = deviceNode(d)
		}
		if a, ok := lookupAttribute(d.Attributes, sl.Spec.Driver, "model"); ok && a.StringValue != nil {
			k.Model = *a.StringValue
		}
		c := caps.of(sl.Spec.Driver, d.Capacity)
		k.Capacity, k.Memory = c.all, c.memory
		if kind == nil || !kind.same(&k) {
			// A copy, so that k stays on the stack for the devices like the last.
			shared := k
			kind = &shared
		}
		dev := &Device{Source: source, Name: d.Name, Kind: kind, device: d, Healthy: true}
		var fromRules []string
		if len(rules) > 0 {
			fromRules = rules[dev.ID()]
		}
		dev.Taints = taintsOf(d.Taints, fromRules)
		for _, t := range d.Taints {
			if blocksScheduling(t.Effect) {
				dev.Healthy = false
			}
		}
		dev.setAllocations(hs, names)
		f.Devices = append(f.Devices, dev)
		made = append(made, dev)
	}
	return made
}

// unchanged is f's device d of slice sl when it is held by the results hs as it was, and its
// counters cannot have changed (it consumes none); else nil.
func (f *Fleet) unchanged(sl *resourceapi.ResourceSlice, d *resourceapi.Device, hs []holding, claims []*Claim) *Device {
	if f == nil || len(d.ConsumesCounters) > 0 {
		return nil
	}
	pd := f.DeviceNamed(sl.Spec.Driver, sl.Spec.Pool.Name, d.Name)
	if pd == nil || pd.device != d || pd.slice != sl || pd.Fault != "" || !pd.sameHolders(hs, claims) {
		return nil
	}
	return pd
}

// indexByID orders the devices by ID for Device. Devices ordered by node are mostly in that
// order already (a node's pool is named after it), which sortStable checks first.
func (f *Fleet) indexByID() {
	f.byID = make([]int32, len(f.Devices))
	for i := range f.byID {
		f.byID[i] = int32(i)
	}
	sortStable(f.byID, func(a, b int32) int {
		da, db := f.Devices[a], f.Devices[b]
		return cmp.Or(cmp.Compare(da.Driver, db.Driver), cmp.Compare(da.Pool, db.Pool), cmp.Compare(da.Name, db.Name))
	})
}

// Holders are the allocations that hold the device: admin access only watches it. Read-only: it
// is Allocations itself unless one of them has admin access, as few do (a diagnosis asks every
// device of a fleet of 40,000).
func (d *Device) Holders() []Allocation {
	if !slices.ContainsFunc(d.Allocations, func(a Allocation) bool { return a.AdminAccess }) {
		return d.Allocations
	}
	var out []Allocation
	for _, a := range d.Allocations {
		if !a.AdminAccess {
			out = append(out, a)
		}
	}
	return out
}

// sortStable sorts s stably unless it is sorted already, as lists from the API server come (by
// namespace and name): checking is one pass, sorting 40,000 claims or devices several.
func sortStable[E any](s []E, cmp func(a, b E) int) {
	if !slices.IsSortedFunc(s, cmp) {
		slices.SortStableFunc(s, cmp)
	}
}

func sliceNode(sl *resourceapi.ResourceSlice) string {
	switch {
	case sl.Spec.NodeName != nil && *sl.Spec.NodeName != "":
		return *sl.Spec.NodeName
	case sl.Spec.AllNodes != nil && *sl.Spec.AllNodes:
		return AllNodes
	}
	return SelectedNodes
}

func deviceNode(d *resourceapi.Device) string {
	switch {
	case d.NodeName != nil && *d.NodeName != "":
		return *d.NodeName
	case d.AllNodes != nil && *d.AllNodes:
		return AllNodes
	}
	return SelectedNodes
}

// lookupAttribute finds an attribute by its name in the driver's domain, written either way.
func lookupAttribute(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, driver, name string) (resourceapi.DeviceAttribute, bool) {
	if a, ok := attrs[resourceapi.QualifiedName(name)]; ok {
		return a, true
	}
	a, ok := attrs[resourceapi.QualifiedName(driver+"/"+name)]
	return a, ok
}

func lookupCapacity(caps map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, driver, name string) (resourceapi.DeviceCapacity, bool) {
	if c, ok := caps[resourceapi.QualifiedName(name)]; ok {
		return c, true
	}
	c, ok := caps[resourceapi.QualifiedName(driver+"/"+name)]
	return c, ok
}

func blocksScheduling(e resourceapi.DeviceTaintEffect) bool {
	return e == resourceapi.DeviceTaintEffectNoSchedule || e == resourceapi.DeviceTaintEffectNoExecute
}

func joinMax(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:n], ", ") + " and " + strconv.Itoa(len(items)-n) + " more"
}
