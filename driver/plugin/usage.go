package plugin

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
)

// usage is what the prepared claims hold, device by device: the last place that stops two
// workloads from using one GPU unknowingly should the scheduler's accounting ever go wrong. A
// device allocated whole belongs to one claim; a shared one (allowMultipleAllocations) holds any
// number of shares as long as their consumed capacities fit in the device's; devices of a
// partitionable GPU together consume at most its counters (each device once, however many
// shares). Admin access holds nothing (it is meant to see devices others use).
type usage struct {
	whole  map[string]checkpoint.PreparedClaim
	shares map[string][]share
}

// share is one share of a device, by the claim holding it.
type share struct {
	claim    checkpoint.PreparedClaim
	consumed map[string]resource.Quantity
}

func deviceKey(d checkpoint.PreparedDevice) string { return d.Pool + "/" + d.Device }

// devicesInUse is the usage of the prepared claims.
func devicesInUse(claims map[types.UID]checkpoint.PreparedClaim) *usage {
	u := &usage{whole: map[string]checkpoint.PreparedClaim{}, shares: map[string][]share{}}
	for _, c := range claims {
		u.add(c)
	}
	return u
}

func (u *usage) add(c checkpoint.PreparedClaim) {
	for _, d := range c.Devices {
		switch {
		case d.AdminAccess:
		case d.ShareID != "":
			u.shares[deviceKey(d)] = append(u.shares[deviceKey(d)], share{claim: c, consumed: d.ConsumedCapacity})
		default:
			u.whole[deviceKey(d)] = c
		}
	}
}

// check refuses devices that another claim holds whole, whole devices that other claims hold
// shares of, shares that together with those held (by other claims and earlier devices of this
// claim) would consume more than the device has, and devices whose counters would exceed a counter
// set beside those of the devices held (a partition of a GPU held whole, or the reverse).
func (u *usage) check(claim *resourceapi.ResourceClaim, devices []checkpoint.PreparedDevice, inv *inventory) error {
	pending := map[string][]share{}
	holders := u.holders()
	for _, d := range devices {
		if d.AdminAccess {
			continue
		}
		key := deviceKey(d)
		if other, ok := u.whole[key]; ok && other.UID != claim.UID {
			return fmt.Errorf("claim %s/%s: device %s/%s is already prepared for claim %s/%s (uid %s); unprepare that claim first",
				claim.Namespace, claim.Name, d.Pool, d.Device, other.Namespace, other.Name, other.UID)
		}
		held := append(append([]share(nil), u.shares[key]...), pending[key]...)
		if d.ShareID == "" {
			for _, s := range held {
				if s.claim.UID != claim.UID {
					return fmt.Errorf("claim %s/%s: device %s/%s is already prepared for claim %s/%s (uid %s); unprepare that claim first",
						claim.Namespace, claim.Name, d.Pool, d.Device, s.claim.Namespace, s.claim.Name, s.claim.UID)
				}
			}
		} else if err := fits(claim, d, held, inv.capacity[d.Device]); err != nil {
			return err
		}
		if _, charged := holders[key]; !charged {
			if err := countersFit(claim, d, holders, inv); err != nil {
				return err
			}
			holders[key] = fmt.Sprintf("%s/%s", claim.Namespace, claim.Name)
		}
		if d.ShareID != "" {
			pending[key] = append(pending[key], share{claim: checkpoint.PreparedClaim{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name}, consumed: d.ConsumedCapacity})
		}
	}
	return nil
}

// holders are the devices held, whole or in shares, each by the first claim holding it.
func (u *usage) holders() map[string]string {
	out := make(map[string]string, len(u.whole)+len(u.shares))
	for key, c := range u.whole {
		out[key] = fmt.Sprintf("%s/%s", c.Namespace, c.Name)
	}
	for key, shares := range u.shares {
		out[key] = fmt.Sprintf("%s/%s", shares[0].claim.Namespace, shares[0].claim.Name)
	}
	return out
}

// countersFit checks that a device's counters and those of the devices held stay within each
// counter set it consumes, as the scheduler's allocation of partitionable devices keeps them.
func countersFit(claim *resourceapi.ResourceClaim, d checkpoint.PreparedDevice, holders map[string]string, inv *inventory) error {
	for _, c := range inv.consumes[d.Device] {
		total, ok := inv.counterSets[c.CounterSet]
		if !ok {
			continue // not a counter set this node publishes now; the scheduler judged it
		}
		names := slices.Sorted(maps.Keys(c.Counters))
		for _, name := range names {
			sum := c.Counters[name].Value.DeepCopy()
			var others []string
			for key, holder := range holders {
				pool, device, _ := strings.Cut(key, "/")
				if pool != d.Pool {
					continue
				}
				for _, hc := range inv.consumes[device] {
					if q, ok := hc.Counters[name]; ok && hc.CounterSet == c.CounterSet {
						sum.Add(q.Value)
						others = append(others, fmt.Sprintf("%s %s %s", holder, device, ptr.To(q.Value).String()))
					}
				}
			}
			if limit, ok := total[name]; ok && sum.Cmp(limit.Value) > 0 {
				sort.Strings(others)
				return fmt.Errorf("claim %s/%s: device %s/%s needs %s %s of counter set %s, which has %s beside the devices prepared (%s); unprepare one of them first",
					claim.Namespace, claim.Name, d.Pool, d.Device, name, ptr.To(c.Counters[name].Value).String(), c.CounterSet, ptr.To(limit.Value).String(), strings.Join(others, ", "))
			}
		}
	}
	return nil
}

// fits checks that a new share and those held consume at most the device's capacity.
func fits(claim *resourceapi.ResourceClaim, d checkpoint.PreparedDevice, held []share, capacity map[resourceapi.QualifiedName]resourceapi.DeviceCapacity) error {
	names := make([]string, 0, len(d.ConsumedCapacity))
	for name := range d.ConsumedCapacity {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		total, ok := capacity[resourceapi.QualifiedName(name)]
		if !ok {
			continue // not a capacity this device publishes now; the scheduler judged it
		}
		want := d.ConsumedCapacity[name]
		sum := want.DeepCopy()
		var holders []string
		for _, s := range held {
			if q, ok := s.consumed[name]; ok {
				sum.Add(q)
				holders = append(holders, fmt.Sprintf("%s/%s %s", s.claim.Namespace, s.claim.Name, q.String()))
			}
		}
		if sum.Cmp(total.Value) > 0 {
			sort.Strings(holders)
			return fmt.Errorf("claim %s/%s: device %s/%s: a share of %s %s does not fit in its %s beside the shares prepared (%s); unprepare one of them first",
				claim.Namespace, claim.Name, d.Pool, d.Device, name, want.String(), total.Value.String(), strings.Join(holders, ", "))
		}
	}
	return nil
}
