package diagnosis

import (
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
)

// fleetIndex finds a fleet's devices by their snapshot index. It is a number of 4 bytes per
// snapshot device rather than a map entry of 30 per fleet device: Held keeps one with each fleet,
// two while a rebuild runs, and a fleet of busy pools is most of the devices of a busy cluster.
type fleetIndex struct {
	fl *deviceusage.Fleet
	// at[di] is 1 + the position in fl.Devices of snapshot device di, 0 when the fleet lacks it;
	// nil when the fleet has no device, as when no claim holds one.
	at []int32
}

// of is snapshot device di in the fleet, or nil when the fleet lacks it: a free device, when the
// fleet has only its busy pools.
func (x fleetIndex) of(di int) *deviceusage.Device {
	if x.at == nil {
		return nil
	}
	if i := x.at[di]; i > 0 {
		return x.fl.Devices[i-1]
	}
	return nil
}

// indexFleet indexes fl, which must have been built from the slices s was. It depends on s and
// fl only: Held builds it with the fleet, once for every question about them.
func indexFleet(s *feasibility.Snapshot, fl *deviceusage.Fleet) fleetIndex {
	x := fleetIndex{fl: fl}
	if len(fl.Devices) == 0 {
		return x
	}
	x.at = make([]int32, s.NumDevices())
	// A fleet of busy pools is small and the view large: look each fleet device up among its
	// node's devices, and only those local to no known node among all.
	var elsewhere map[structured.DeviceID]int32
	for i, dev := range fl.Devices {
		n, ok := s.NodeIndex(dev.Node)
		if !ok {
			if elsewhere == nil {
				elsewhere = map[structured.DeviceID]int32{}
			}
			elsewhere[dev.ID()] = int32(i + 1)
			continue
		}
		for dn := range s.NodeDevices(n) {
			if di := int(dn); s.DeviceIs(di, dev.Driver, dev.Pool, dev.Name) {
				x.at[di] = int32(i + 1)
			}
		}
	}
	if len(elsewhere) > 0 {
		for di := range s.NumDevices() {
			if i, ok := elsewhere[s.DeviceID(di)]; ok {
				x.at[di] = i
			}
		}
	}
	return x
}
