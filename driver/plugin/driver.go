// Package plugin implements the kubelet side of the driver: the kubeletplugin.DRAPlugin that
// prepares and unprepares claims (CDI spec + checkpoint), publishing the node's devices as
// ResourceSlices, reconciliation on start and the uninstall hook's slice cleanup.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/driver/cdi"
	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
	"github.com/gpu-dra/gpu-dra/driver/metrics"
)

// DeviceSource lists the devices of this node. The simulated inventory is one; a hardware backend
// can be another without touching publishing or prepare.
type DeviceSource interface {
	Devices(ctx context.Context) ([]resourceapi.Device, error)
}

// Driver is the DRAPlugin. Every call loads the checkpoint afresh: during a rolling update the
// kubelet may prepare through one instance and unprepare through the other, so no state may live
// only in memory. The helper serializes calls (with a file lock across instances).
type Driver struct {
	driverName string
	poolName   string
	// stateMu serializes every use of the checkpoint store in this process (the store is not safe
	// for concurrent use): the kubelet's calls, which the helper serializes among themselves, and
	// the reads of the health path and the status resync, which it knows nothing of. See lockState.
	stateMu sync.Mutex
	mutex   sync.RWMutex
	// inventory is what the node publishes, replaced when it changes: which devices it accepts
	// allocations for and what they may hold together.
	inventory *inventory
	// attributes and metadata are what each device publishes, by name, replaced with the
	// inventory: the data of its claim's status and the device metadata file in the container.
	attributes map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	metadata   map[string]*kubeletplugin.DeviceMetadata
	status     StatusRecorder
	cdi        *cdi.Writer
	store      *checkpoint.Store
	metrics    *metrics.Metrics
	onFatal    func(error)
	// health is the node's faults, streamed to the kubelet; nil declines health reporting.
	health HealthTracker
}

var _ kubeletplugin.DRAPlugin = &Driver{}

// DriverOption configures a Driver.
type DriverOption func(*Driver)

// WithMetrics records prepare/unprepare metrics; without it a private registry is used.
func WithMetrics(m *metrics.Metrics) DriverOption { return func(d *Driver) { d.metrics = m } }

// WithFatalHandler is called on background errors that retrying will not fix (e.g. the gRPC server
// died); the caller should shut down.
func WithFatalHandler(f func(error)) DriverOption { return func(d *Driver) { d.onFatal = f } }

// NewDriver returns the DRAPlugin of one node. The devices are read once: they define which
// allocations this node accepts.
func NewDriver(ctx context.Context, driverName, nodeName string, source DeviceSource, writer *cdi.Writer, store *checkpoint.Store, opts ...DriverOption) (*Driver, error) {
	devs, sets, err := listDevices(ctx, source)
	if err != nil {
		return nil, fmt.Errorf("list devices of node %s: %w", nodeName, err)
	}
	d := &Driver{
		driverName: driverName,
		poolName:   nodeName,
		cdi:        writer,
		store:      store,
	}
	for _, o := range opts {
		o(d)
	}
	if d.metrics == nil {
		d.metrics = metrics.New()
	}
	d.setDevices(devs, sets)
	if d.status == nil {
		d.status = noStatus{}
	}
	return d, nil
}

// SetDevices replaces the devices this node accepts allocations for, after an inventory change.
// Claims already prepared keep their recorded devices.
func (d *Driver) SetDevices(ctx context.Context, source DeviceSource) error {
	devs, sets, err := listDevices(ctx, source)
	if err != nil {
		return fmt.Errorf("list devices of node %s: %w", d.poolName, err)
	}
	d.setDevices(devs, sets)
	return nil
}

// listDevices is what a source publishes: its devices and, if it has any, the counter sets they
// consume.
func listDevices(ctx context.Context, source DeviceSource) ([]resourceapi.Device, []resourceapi.CounterSet, error) {
	devs, err := source.Devices(ctx)
	if err != nil {
		return nil, nil, err
	}
	var sets []resourceapi.CounterSet
	if cs, ok := source.(CounterSource); ok {
		sets, err = cs.SharedCounters(ctx)
	}
	return devs, sets, err
}

func (d *Driver) setDevices(devs []resourceapi.Device, sets []resourceapi.CounterSet) {
	attributes := make(map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(devs))
	metadata := make(map[string]*kubeletplugin.DeviceMetadata, len(devs))
	for _, dev := range devs {
		attributes[dev.Name] = dev.Attributes
		metadata[dev.Name] = deviceMetadata(dev.Attributes)
	}
	inv := newInventory(devs, sets)
	d.metrics.SetDevices(deviceInfos(devs))
	d.mutex.Lock()
	defer d.mutex.Unlock()
	d.inventory, d.attributes, d.metadata = inv, attributes, metadata
}

// shareID is the share a prepared device is, for the kubelet; nil for a whole device.
func shareID(dev checkpoint.PreparedDevice) *types.UID {
	if dev.ShareID == "" {
		return nil
	}
	return ptr.To(types.UID(dev.ShareID))
}

// PrepareResourceClaims writes a CDI spec per new claim, then records all of them in one checkpoint
// save. A crash in between leaves CDI specs without entries, which Reconcile removes; the kubelet
// then retries the prepare. Already prepared claims return their recorded devices.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	if len(claims) == 0 {
		// The liveness probe's call: it proves the socket and the lock work, nothing to record.
		return result, nil
	}
	logger := klog.FromContext(ctx)
	start := time.Now()
	// The helper holds the serialization file lock, if it uses one: only the process's own lock.
	d.stateMu.Lock()
	defer d.stateMu.Unlock()
	data, err := d.loadCheckpoint(ctx)
	if err != nil {
		return nil, err
	}
	inUse := devicesInUse(data.Claims)
	var added []types.UID
	for _, claim := range claims {
		if prepared, ok := data.Claims[claim.UID]; ok {
			// The spec may be missing if it was removed behind our back; restore it so the
			// container can still start.
			if !d.cdi.Exists(claim.UID) {
				if err := d.cdi.Write(prepared); err != nil {
					result[claim.UID] = kubeletplugin.PrepareResult{Err: err}
					continue
				}
			}
			result[claim.UID] = kubeletplugin.PrepareResult{Devices: d.resultDevices(prepared)}
			continue
		}
		d.mutex.RLock()
		inv := d.inventory
		d.mutex.RUnlock()
		devices, err := claimDevices(d.driverName, d.poolName, inv, claim)
		if err == nil {
			err = inUse.check(claim, devices, inv)
		}
		if err == nil {
			c := checkpoint.PreparedClaim{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name, Devices: devices}
			if err = d.cdi.Write(c); err == nil {
				data.Claims[claim.UID] = c
				added = append(added, claim.UID)
				inUse.add(c)
				result[claim.UID] = kubeletplugin.PrepareResult{Devices: d.resultDevices(c)}
				logger.V(3).Info("Prepared claim", "claim", klog.KObj(claim), "uid", claim.UID, "devices", len(devices))
			}
		}
		if err != nil {
			logger.Error(err, "Preparing claim failed", "claim", klog.KObj(claim))
			result[claim.UID] = kubeletplugin.PrepareResult{Err: err}
		}
	}
	if len(added) > 0 {
		if err := d.saveCheckpoint(data); err != nil {
			// Without the entry the spec would be an orphan; remove it and let the kubelet retry.
			for _, uid := range added {
				_ = d.cdi.Remove(uid)
				result[uid] = kubeletplugin.PrepareResult{Err: err}
			}
		}
	}
	d.recordPrepared(data)
	per := time.Since(start) / time.Duration(len(claims))
	for _, r := range result {
		d.metrics.ObservePrepare(per, r.Err)
	}
	for _, claim := range claims {
		if c, ok := data.Claims[claim.UID]; ok && result[claim.UID].Err == nil {
			d.status.Record(claim, d.statusDevices(c))
		}
	}
	return result, nil
}

// resultDevices is the answer to the kubelet, the same whenever the claim is prepared again. The
// metadata is what the device publishes now; the kubeletplugin helper writes it into the claim's
// device metadata file when that is enabled.
func (d *Driver) resultDevices(c checkpoint.PreparedClaim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(c.Devices))
	d.mutex.RLock()
	defer d.mutex.RUnlock()
	for _, dev := range c.Devices {
		out = append(out, kubeletplugin.Device{
			Requests:     []string{dev.Request},
			PoolName:     dev.Pool,
			DeviceName:   dev.Device,
			CDIDeviceIDs: []string{d.cdi.DeviceID(dev.CDIDevice)},
			Metadata:     d.metadata[dev.Device],
			ShareID:      shareID(dev),
		})
	}
	return out
}

// UnprepareResourceClaims drops the checkpoint entries first, then the CDI specs: a crash in
// between leaves orphan specs, which Reconcile removes, never an entry without its spec.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := make(map[types.UID]error, len(claims))
	if len(claims) == 0 {
		return result, nil
	}
	logger := klog.FromContext(ctx)
	start := time.Now()
	d.stateMu.Lock()
	defer d.stateMu.Unlock()
	data, err := d.loadCheckpoint(ctx)
	if err != nil {
		return nil, err
	}
	changed := false
	for _, c := range claims {
		d.status.Forget(c.UID)
		if _, ok := data.Claims[c.UID]; ok {
			delete(data.Claims, c.UID)
			changed = true
		}
	}
	if changed {
		if err := d.saveCheckpoint(data); err != nil {
			return nil, err
		}
	}
	for _, c := range claims {
		// Also when there was no entry: a spec may be left from a prepare that crashed.
		result[c.UID] = d.cdi.Remove(c.UID)
		logger.V(3).Info("Unprepared claim", "claim", c.NamespacedName, "uid", c.UID, "err", result[c.UID])
	}
	d.recordPrepared(data)
	per := time.Since(start) / time.Duration(len(claims))
	for _, err := range result {
		d.metrics.ObserveUnprepare(per, err)
	}
	return result, nil
}

// loadCheckpoint is what is prepared, rebuilt first if the checkpoint turned out corrupt
// (loadState); d.stateMu must be held. loadState and saveCheckpoint count failures in the errors
// metric, so an alert sees a failing disk before the kubelet's retries do.
func (d *Driver) loadCheckpoint(ctx context.Context) (*checkpoint.Data, error) {
	data, _, err := d.loadState(ctx)
	if err != nil {
		return nil, fmt.Errorf("load checkpoint: %w", err)
	}
	return data, nil
}

func (d *Driver) saveCheckpoint(data *checkpoint.Data) error {
	if err := d.store.Save(data); err != nil {
		d.metrics.Error(metrics.ComponentCheckpoint)
		return fmt.Errorf("save checkpoint: %w", err)
	}
	return nil
}

// HandleError logs background errors of the helper. Publishing errors are recoverable (the library
// retries); dropped fields mean we publish something the cluster does not accept and are counted
// separately so a test or alert can see them. Anything else is fatal.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	utilruntime.HandleErrorWithContext(ctx, err, msg)
	var dropped *resourceslice.DroppedFieldsError
	switch {
	case errors.As(err, &dropped):
		d.metrics.Error(metrics.ComponentPublishDroppedFields)
	case errors.Is(err, kubeletplugin.ErrRecoverable):
		d.metrics.Error(metrics.ComponentPublish)
	default:
		d.metrics.Error(metrics.ComponentGRPC)
		if d.onFatal != nil {
			d.onFatal(fmt.Errorf("%s: %w", msg, err))
		}
	}
}

// HasDevice reports whether the node publishes a device of that name.
func (d *Driver) HasDevice(name string) bool {
	d.mutex.RLock()
	defer d.mutex.RUnlock()
	_, ok := d.attributes[name]
	return ok
}

// DeviceCount is the number of devices the node publishes.
func (d *Driver) DeviceCount() int {
	d.mutex.RLock()
	defer d.mutex.RUnlock()
	return len(d.attributes)
}
