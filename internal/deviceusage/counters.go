package deviceusage

import (
	"cmp"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// CounterSet is a pool's shared counters (partitionable devices: the partitions of one GPU draw
// on its memory and compute) with what the allocated devices use of them.
type CounterSet struct {
	Driver   string                 `json:"driver"`
	Pool     string                 `json:"pool"`
	Name     string                 `json:"name"`
	Counters map[string]CounterUsed `json:"counters"`
}

// CounterUsed is one counter's value and the part allocated devices consume.
type CounterUsed struct {
	Value resource.Quantity `json:"value"`
	Used  resource.Quantity `json:"used"`
}

type counterKey struct{ driver, pool, set string }

// addCounters sums what held devices consume of their pools' counter sets and marks the devices
// that are not held but no longer fit (StateBlocked). A device consumes its counters once, however
// many shares it has.
func (f *Fleet) addCounters() {
	sets := map[counterKey]*CounterSet{}
	for _, sl := range f.Slices {
		for _, cs := range sl.Spec.SharedCounters {
			k := counterKey{sl.Spec.Driver, sl.Spec.Pool.Name, cs.Name}
			if sets[k] != nil {
				continue
			}
			set := &CounterSet{Driver: k.driver, Pool: k.pool, Name: k.set, Counters: map[string]CounterUsed{}}
			for n, c := range cs.Counters {
				set.Counters[n] = CounterUsed{Value: c.Value.DeepCopy()}
			}
			sets[k] = set
			f.CounterSets = append(f.CounterSets, set)
		}
	}
	if len(sets) == 0 {
		return
	}
	slices.SortFunc(f.CounterSets, func(a, b *CounterSet) int {
		return cmp.Or(cmp.Compare(a.Driver, b.Driver), cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Name, b.Name))
	})
	// What held devices use first, then which of the others no longer fit.
	for _, d := range f.Devices {
		if len(d.Holders()) > 0 {
			d.eachCounter(sets, func(_ string, u *CounterUsed, c resourceapi.Counter) { u.Used.Add(c.Value) })
		}
	}
	for _, d := range f.Devices {
		if len(d.Holders()) > 0 {
			continue
		}
		d.eachCounter(sets, func(set string, u *CounterUsed, c resourceapi.Counter) {
			left := u.Value.DeepCopy()
			left.Sub(u.Used)
			if left.Cmp(c.Value) < 0 && !slices.Contains(d.CountersShort, set) {
				d.CountersShort = append(d.CountersShort, set)
			}
		})
	}
}

// eachCounter calls f for every counter the device consumes of a published counter set of its
// pool. A set that is not (yet) published is skipped: the allocator waits for it, this report
// does not guess.
func (d *Device) eachCounter(sets map[counterKey]*CounterSet, f func(set string, u *CounterUsed, c resourceapi.Counter)) {
	for _, cc := range d.device.ConsumesCounters {
		set := sets[counterKey{d.Driver, d.Pool, cc.CounterSet}]
		if set == nil {
			continue
		}
		for n, c := range cc.Counters {
			u, ok := set.Counters[n]
			if !ok {
				continue
			}
			f(cc.CounterSet, &u, c)
			set.Counters[n] = u
		}
	}
}
