package plugin

import (
	"fmt"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
)

// usage is what the prepared claims hold, device by device: the last place that stops two
// workloads from using one GPU unknowingly should the scheduler's accounting ever go wrong. A
// device allocated whole belongs to one claim; a shared one (allowMultipleAllocations) holds any
// number of shares as long as their consumed capacities fit in the device's. Admin access holds
// nothing (it is meant to see devices others use).
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
// shares of, and shares that together with those held (by other claims and earlier devices of
// this claim) would consume more than the device has. capacity is a device's published capacity
// by name.
func (u *usage) check(claim *resourceapi.ResourceClaim, devices []checkpoint.PreparedDevice, capacity func(device string) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity) error {
	pending := map[string][]share{}
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
			continue
		}
		if err := fits(claim, d, held, capacity(d.Device)); err != nil {
			return err
		}
		pending[key] = append(pending[key], share{claim: checkpoint.PreparedClaim{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name}, consumed: d.ConsumedCapacity})
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
