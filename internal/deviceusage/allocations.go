package deviceusage

import (
	"cmp"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
)

// holding is one device result of an allocated claim: result of claims[claim].
type holding struct{ claim, result int32 }

// holdings are the results naming each device place: those of place p are items[start[p]:start[p+1]],
// in the order of the claims, then of their results. One array rather than a list a device: a
// rebuild of the fleet makes it anew while most devices keep the lists they had.
type holdings struct {
	start []int32
	items []holding
}

func (h holdings) of(p int) []holding { return h.items[h.start[p]:h.start[p+1]] }

// sortedClaims orders claims by namespace and name, the order of their allocations on a device.
// A cache lists them in no order, and no two of them have one name: an unstable sort orders them
// alike every time, in a fraction of the time a stable one takes at 40,000 claims.
func sortedClaims(claims []*Claim) []*Claim {
	sorted := slices.Clone(claims)
	byName := func(a, b *Claim) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	}
	if !slices.IsSortedFunc(sorted, byName) {
		slices.SortFunc(sorted, byName)
	}
	return sorted
}

// addAllocations gathers the AllocatedState the way the scheduler does
// (pkg/scheduler/framework/plugins/dynamicresources, foreachAllocatedDevice): admin access holds
// nothing, a result with a shareID is one share of a shared device and consumes capacity, any other
// result holds its device. It lists the claims without an allocation and the results naming no
// device of the fleet, and returns the results naming each of the fleet's device places (byID).
func (f *Fleet) addAllocations(claims []*Claim, places int, byID map[structured.DeviceID]int32) holdings {
	results := 0
	for _, c := range claims {
		results += len(c.Results)
	}
	f.state = structured.AllocatedState{
		AllocatedDevices:         make(sets.Set[structured.DeviceID], results),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	// The place of every result, in order (-1: no device of the fleet), and how many a place has.
	at := make([]int32, 0, results)
	h := holdings{start: make([]int32, places+1)}
	for _, c := range claims {
		if !c.Allocated {
			f.Pending = append(f.Pending, c.Namespace+"/"+c.Name)
			continue
		}
		for ri := range c.Results {
			r := &c.Results[ri]
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			switch {
			case r.AdminAccess:
			case r.ShareID != nil:
				f.state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
				if r.ConsumedCapacity != nil {
					f.state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
				}
			default:
				f.state.AllocatedDevices.Insert(id)
			}
			p, ok := byID[id]
			if !ok {
				a := newHolderNames(c).allocation(c, ri)
				a.Device = id.String()
				f.Unpublished = append(f.Unpublished, a)
				p = -1
			} else {
				h.start[p+1]++
			}
			at = append(at, p)
		}
	}
	for p := range places {
		h.start[p+1] += h.start[p]
	}
	h.items = make([]holding, h.start[places])
	next := slices.Clone(h.start[:places])
	k := 0
	for ci, c := range claims {
		if !c.Allocated {
			continue
		}
		for ri := range c.Results {
			if p := at[k]; p >= 0 {
				h.items[next[p]] = holding{claim: int32(ci), result: int32(ri)}
				next[p]++
			}
			k++
		}
	}
	return h
}

// holderNames are what the allocations of one claim say of it, made once for all of them.
type holderNames struct {
	name            string
	pods, consumers []string
}

func newHolderNames(c *Claim) holderNames {
	pods, consumers := reservedFor(c)
	return holderNames{name: c.Namespace + "/" + c.Name, pods: pods, consumers: consumers}
}

// allocation is result ri of claim c.
func (n holderNames) allocation(c *Claim, ri int) Allocation {
	r := &c.Results[ri]
	a := Allocation{Claim: n.name, Request: r.Request, Pods: n.pods, Consumers: n.consumers,
		AdminAccess: r.AdminAccess, ConsumedCapacity: r.ConsumedCapacity, from: c}
	if r.ShareID != nil {
		a.ShareID = string(*r.ShareID)
	}
	return a
}

// namer makes the holderNames of the claims whose allocations new devices take: those of one
// claim's devices come one after the other, so the last claim's are kept.
type namer struct {
	claims []*Claim
	last   int32
	names  holderNames
}

func (n *namer) of(ci int32) holderNames {
	if n.last != ci {
		n.last, n.names = ci, newHolderNames(n.claims[ci])
	}
	return n.names
}

// setAllocations gives a device made for this fleet the allocations hs, and sums the capacity
// they consume.
func (d *Device) setAllocations(hs []holding, n *namer) {
	if len(hs) == 0 {
		return
	}
	d.Allocations = make([]Allocation, len(hs))
	for i, h := range hs {
		c := n.claims[h.claim]
		a := n.of(h.claim).allocation(c, int(h.result))
		d.Allocations[i] = a
		if a.AdminAccess || len(a.ConsumedCapacity) == 0 {
			continue
		}
		if d.Consumed == nil {
			d.Consumed = map[resourceapi.QualifiedName]resource.Quantity{}
		}
		for name, q := range a.ConsumedCapacity {
			sum := d.Consumed[name]
			sum.Add(q)
			d.Consumed[name] = sum
		}
	}
}

// sameHolders: d's allocations are the results hs. A cache replaces a claim, never changes it:
// the same claim objects in the same order have the same results naming d.
func (d *Device) sameHolders(hs []holding, claims []*Claim) bool {
	if len(d.Allocations) != len(hs) {
		return false
	}
	for i, h := range hs {
		if d.Allocations[i].from != claims[h.claim] {
			return false
		}
	}
	return true
}

// reservedFor splits a claim's consumers into pods (namespace/name) and anything else.
func reservedFor(c *Claim) (pods, others []string) {
	for _, r := range c.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" {
			pods = append(pods, c.Namespace+"/"+r.Name)
			continue
		}
		res := r.Resource
		if r.APIGroup != "" {
			res += "." + r.APIGroup
		}
		others = append(others, res+"/"+r.Name)
	}
	return pods, others
}
