package plugin

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
	"github.com/gpu-dra/gpu-dra/driver/devicestatus"
)

// StatusRecorder records which devices a prepared claim got in the claim's status (KEP-4817), off
// the prepare path: its methods only queue work (devicestatus.Writer implements it).
type StatusRecorder interface {
	// Record is called after a claim is prepared, with the claim as the prepare read it.
	Record(claim *resourceapi.ResourceClaim, devices []devicestatus.Device)
	// Resync is called for claims prepared before this process started.
	Resync(namespace, name string, uid types.UID, devices []devicestatus.Device)
	// Forget is called when a claim is unprepared.
	Forget(uid types.UID)
}

// WithStatusRecorder records the devices of each prepared claim in its status.
func WithStatusRecorder(r StatusRecorder) DriverOption { return func(d *Driver) { d.status = r } }

// noStatus is the recorder of a driver without one.
type noStatus struct{}

func (noStatus) Record(*resourceapi.ResourceClaim, []devicestatus.Device) {}
func (noStatus) Resync(string, string, types.UID, []devicestatus.Device)  {}
func (noStatus) Forget(types.UID)                                         {}

// statusDevices are a prepared claim's devices with the attributes they publish now.
func (d *Driver) statusDevices(c checkpoint.PreparedClaim) []devicestatus.Device {
	d.mutex.RLock()
	defer d.mutex.RUnlock()
	out := make([]devicestatus.Device, 0, len(c.Devices))
	for _, dev := range c.Devices {
		out = append(out, devicestatus.Device{Pool: dev.Pool, Name: dev.Device, ShareID: dev.ShareID, Attributes: d.attributes[dev.Device]})
	}
	return out
}

// ResyncStatus queues every prepared claim for its status: a write lost when an earlier instance
// stopped is made now, and one already made is not repeated.
func (d *Driver) ResyncStatus(ctx context.Context) error {
	claims, err := d.PreparedClaims(ctx)
	if err != nil {
		return fmt.Errorf("resync claim status: %w", err)
	}
	for uid, c := range claims {
		d.status.Resync(c.Namespace, c.Name, uid, d.statusDevices(c))
	}
	klog.FromContext(ctx).V(3).Info("Queued prepared claims for their device status", "claims", len(claims))
	return nil
}
