package deviceusage

import (
	"cmp"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/dynamic-resource-allocation/structured"
)

// Selection limits a report.
type Selection struct {
	// Driver keeps only this driver's devices; "" keeps every driver's.
	Driver string
	// Nodes, when not nil, keeps only the devices usable from one of them: their own and those
	// of slices (or devices) that select them by label or serve all nodes.
	Nodes []*v1.Node
}

// Report is the status of the selected devices: the output of `kubectl dra status`.
type Report struct {
	Nodes  []NodeReport `json:"nodes"`
	Totals []Total      `json:"totals"`
	// CounterSets of the pools the selected devices belong to.
	CounterSets []*CounterSet `json:"counterSets,omitempty"`
	// Unpublished allocations and Pending claims are the cluster's, whatever the selection.
	Unpublished []Allocation `json:"unpublishedAllocations,omitempty"`
	Pending     []string     `json:"pendingClaims,omitempty"`
}

// NodeReport is a node's devices; Name may be AllNodes or SelectedNodes.
type NodeReport struct {
	Name    string    `json:"name"`
	Devices []*Device `json:"devices"`
}

// Total counts one model's devices by use. Devices = Free + Allocated + Blocked + Unhealthy: an
// unhealthy device counts there whether or not a claim holds it.
type Total struct {
	Driver    string `json:"driver"`
	Model     string `json:"model"`
	Devices   int    `json:"devices"`
	Free      int    `json:"free"`
	Allocated int    `json:"allocated"`
	Blocked   int    `json:"blocked"`
	Unhealthy int    `json:"unhealthy"`
}

// Use is what a Total counts a device as: each device once, an unhealthy one as unhealthy
// whether or not a claim holds it.
type Use string

// The uses of a device, as Totals and the webhook's fleet metrics count them.
const (
	UseFree      Use = "free"
	UseAllocated Use = "allocated"
	UseBlocked   Use = "blocked"
	UseUnhealthy Use = "unhealthy"
)

// Uses are all values of Use.
var Uses = []Use{UseFree, UseAllocated, UseBlocked, UseUnhealthy}

// Use is what the device counts as.
func (d *Device) Use() Use {
	switch {
	case !d.Healthy:
		return UseUnhealthy
	case d.State == StateAllocated || d.State == StateShared:
		return UseAllocated
	case d.State == StateBlocked:
		return UseBlocked
	}
	return UseFree
}

// Report returns the selected devices by node and the totals per model.
func (f *Fleet) Report(sel Selection) *Report {
	r := &Report{Nodes: []NodeReport{}, Totals: []Total{}, Unpublished: f.Unpublished, Pending: f.Pending}
	totals := map[[2]string]*Total{}
	pools := map[[2]string]bool{}
	for _, d := range f.Devices {
		if sel.Driver != "" && d.Driver != sel.Driver {
			continue
		}
		if sel.Nodes != nil && !d.usableFrom(sel.Nodes) {
			continue
		}
		if n := len(r.Nodes); n == 0 || r.Nodes[n-1].Name != d.Node {
			r.Nodes = append(r.Nodes, NodeReport{Name: d.Node})
		}
		last := &r.Nodes[len(r.Nodes)-1]
		last.Devices = append(last.Devices, d)
		pools[[2]string{d.Driver, d.Pool}] = true

		k := [2]string{d.Driver, d.Model}
		t := totals[k]
		if t == nil {
			t = &Total{Driver: d.Driver, Model: d.Model}
			totals[k] = t
		}
		t.Devices++
		switch d.Use() {
		case UseUnhealthy:
			t.Unhealthy++
		case UseAllocated:
			t.Allocated++
		case UseBlocked:
			t.Blocked++
		default:
			t.Free++
		}
	}
	for _, t := range totals {
		r.Totals = append(r.Totals, *t)
	}
	slices.SortFunc(r.Totals, func(a, b Total) int { return cmp.Or(cmp.Compare(a.Driver, b.Driver), cmp.Compare(a.Model, b.Model)) })
	for _, cs := range f.CounterSets {
		if pools[[2]string{cs.Driver, cs.Pool}] {
			r.CounterSets = append(r.CounterSets, cs)
		}
	}
	return r
}

// usableFrom reports whether a pod on one of nodes could get the device.
func (d *Device) usableFrom(nodes []*v1.Node) bool {
	name, allNodes, selector := d.slice.Spec.NodeName, d.slice.Spec.AllNodes, d.slice.Spec.NodeSelector
	if d.slice.Spec.PerDeviceNodeSelection != nil && *d.slice.Spec.PerDeviceNodeSelection {
		name, allNodes, selector = d.device.NodeName, d.device.AllNodes, d.device.NodeSelector
	}
	for _, n := range nodes {
		ok, err := structured.NodeMatches(structured.Features{PartitionableDevices: true}, n, deref(name), deref(allNodes), selector)
		if err == nil && ok {
			return true
		}
	}
	return false
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
