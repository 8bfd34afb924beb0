package plugin

import (
	"context"
	"fmt"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// SliceCreator creates ResourceSlices in whichever resource.k8s.io version the server serves
// (k8s.io/dynamic-resource-allocation/client implements it).
type SliceCreator interface {
	Create(ctx context.Context, slice *resourceapi.ResourceSlice, opts metav1.CreateOptions) (*resourceapi.ResourceSlice, error)
}

// ProbeConsumableCapacity finds out whether the API server keeps what a shared-memory GPU
// publishes (KEP-5075): it dry-runs the creation of a slice of this node with one such device and
// compares what comes back. OpenAPI cannot tell (it lists the fields whatever the feature gate
// says); the server's strategy silently drops them when the gate is off. It returns why not
// when the fields are not kept; an error means the probe itself failed.
func ProbeConsumableCapacity(ctx context.Context, slices SliceCreator, driverName, nodeName string) (reason string, err error) {
	one := resource.MustParse("1Gi")
	probe := probeSlice(driverName, nodeName, resourceapi.Device{
		Name:                     "probe",
		AllowMultipleAllocations: ptr.To(true),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			deviceschema.CapMemory: {Value: one, RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default:    ptr.To(one.DeepCopy()),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(one.DeepCopy())},
			}},
		},
	})
	got, err := slices.Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return "", fmt.Errorf("dry-run create of a ResourceSlice with allowMultipleAllocations: %w", err)
	}
	if len(got.Spec.Devices) != 1 || !ptr.Deref(got.Spec.Devices[0].AllowMultipleAllocations, false) {
		return "API server drops allowMultipleAllocations (DRAConsumableCapacity off)", nil
	}
	if got.Spec.Devices[0].Capacity[deviceschema.CapMemory].RequestPolicy == nil {
		return "API server drops capacity requestPolicy (DRAConsumableCapacity off)", nil
	}
	return "", nil
}

// ProbePartitionable finds out, like ProbeConsumableCapacity, whether the API server keeps what a
// partitioned GPU publishes (KEP-4815) and where it wants the counter sets: it dry-runs a slice
// with a counter set and a device consuming it. 1.34 (with the gate on) keeps both; 1.35 and later
// refuse the two in one slice, and then each alone must be kept. Without the gate the server
// drops the fields.
func ProbePartitionable(ctx context.Context, slices SliceCreator, driverName, nodeName string) (CounterLayout, string, error) {
	const dropped = "API server drops sharedCounters (DRAPartitionableDevices off)"
	one := resource.MustParse("1Gi")
	set := resourceapi.CounterSet{Name: "probe", Counters: map[string]resourceapi.Counter{string(deviceschema.CapMemory): {Value: one}}}
	consumer := resourceapi.Device{Name: "probe", ConsumesCounters: []resourceapi.DeviceCounterConsumption{{
		CounterSet: set.Name, Counters: map[string]resourceapi.Counter{string(deviceschema.CapMemory): {Value: one.DeepCopy()}},
	}}}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	combined := probeSlice(driverName, nodeName, consumer)
	combined.Spec.SharedCounters = []resourceapi.CounterSet{set}
	got, err := slices.Create(ctx, combined, dryRun)
	switch {
	case err == nil && (len(got.Spec.SharedCounters) == 0 || len(got.Spec.Devices) != 1 || len(got.Spec.Devices[0].ConsumesCounters) == 0):
		return 0, dropped, nil
	case err == nil:
		return CountersWithDevices, "", nil
	case !apierrors.IsInvalid(err):
		return 0, "", fmt.Errorf("dry-run create of a ResourceSlice with sharedCounters: %w", err)
	}
	counters := probeSlice(driverName, nodeName)
	counters.Spec.SharedCounters = []resourceapi.CounterSet{set}
	if got, err = slices.Create(ctx, counters, dryRun); err != nil {
		return 0, "", fmt.Errorf("dry-run create of a ResourceSlice with sharedCounters only (after %w)", err)
	}
	if len(got.Spec.SharedCounters) == 0 {
		return 0, dropped, nil
	}
	if got, err = slices.Create(ctx, probeSlice(driverName, nodeName, consumer), dryRun); err != nil {
		return 0, "", fmt.Errorf("dry-run create of a ResourceSlice with a device consuming counters: %w", err)
	}
	if len(got.Spec.Devices) != 1 || len(got.Spec.Devices[0].ConsumesCounters) == 0 {
		return 0, "API server drops consumesCounters (DRAPartitionableDevices off)", nil
	}
	return CountersInOwnSlices, "", nil
}

// ProbeBindingConditions finds out, like ProbeConsumableCapacity, whether the API server keeps the
// binding conditions of an attachable GPU (KEP-5007): they need DRADeviceBindingConditions and
// DRAResourceClaimDeviceStatus, both on by default from 1.36.
func ProbeBindingConditions(ctx context.Context, slices SliceCreator, driverName, nodeName string) (reason string, err error) {
	probe := probeSlice(driverName, nodeName, resourceapi.Device{
		Name:                     "probe",
		BindingConditions:        []string{deviceschema.ConditionAttached},
		BindingFailureConditions: []string{deviceschema.ConditionAttachFailed},
	})
	got, err := slices.Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return "", fmt.Errorf("dry-run create of a ResourceSlice with bindingConditions: %w", err)
	}
	if len(got.Spec.Devices) != 1 || len(got.Spec.Devices[0].BindingConditions) == 0 || len(got.Spec.Devices[0].BindingFailureConditions) == 0 {
		return "API server drops bindingConditions (DRADeviceBindingConditions or DRAResourceClaimDeviceStatus off)", nil
	}
	return "", nil
}

// probeSlice is a slice of this node in a pool of its own, which the dry run never stores.
func probeSlice(driverName, nodeName string, devices ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: nodeName + "-probe-"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driverName,
			NodeName: ptr.To(nodeName),
			Pool:     resourceapi.ResourcePool{Name: nodeName + "-probe", ResourceSliceCount: 1},
			Devices:  devices,
		},
	}
}

// SharingGate decides what a node group publishes: its sharing mode where the API server keeps
// the fields the mode needs, else what it keeps of the mode (exclusive, or for shared partitions
// plain partitions), said once per node group. Each mode's probe runs before the first publish of a
// group in that mode, and its answer is kept until Refresh asks again: a feature gate changes only
// with an API server restart, which an upgrade of the control plane is, and the plugin must not
// need a restart of its own to follow.
type SharingGate struct {
	// ConsumableCapacity returns why shared-memory GPUs are not kept ("" when they are).
	ConsumableCapacity func(ctx context.Context) (string, error)
	// Partitionable returns why partitioned GPUs are not kept ("" when they are) and where the
	// API server wants their counter sets.
	Partitionable func(ctx context.Context) (CounterLayout, string, error)
	// BindingConditions returns why attachable GPUs are not kept ("" when they are).
	BindingConditions func(ctx context.Context) (string, error)

	mutex  sync.Mutex
	probed map[nodegroups.SharingMode]string
	layout CounterLayout
	logged map[string]bool
}

// probedFields names what each mode's probe looks for, for the message when it fails.
var probedFields = map[nodegroups.SharingMode]string{
	nodegroups.SharedMemory: "allowMultipleAllocations",
	nodegroups.Partitioned:  "sharedCounters",
	nodegroups.Attachable:   "bindingConditions",
}

// Effective is the spec to publish for the named group. A shared-partitions group needs both
// fields: without consumable capacity it publishes plain partitions, without partitionable devices
// exclusive GPUs.
func (g *SharingGate) Effective(ctx context.Context, group string, spec nodegroups.GroupSpec) nodegroups.GroupSpec {
	want := spec.ModeOf()
	if want == nodegroups.Exclusive {
		return spec
	}
	g.mutex.Lock()
	defer g.mutex.Unlock()
	needs := []nodegroups.SharingMode{want}
	if want == nodegroups.SharedPartitions {
		needs = []nodegroups.SharingMode{nodegroups.Partitioned, nodegroups.SharedMemory}
	}
	for _, need := range needs {
		reason := g.reason(ctx, need)
		if reason == "" {
			continue
		}
		fallback := &nodegroups.Sharing{Mode: nodegroups.Exclusive}
		if want == nodegroups.SharedPartitions && need == nodegroups.SharedMemory {
			fallback = &nodegroups.Sharing{Mode: nodegroups.Partitioned, Partitions: spec.Sharing.Partitions}
		}
		g.fallBack(ctx, group, want, fallback.Mode, reason)
		spec.Sharing = fallback
		return spec
	}
	return spec
}

// modeFeatures names the Kubernetes feature gate that serves each mode, for the log.
var modeFeatures = map[nodegroups.SharingMode]string{
	nodegroups.SharedMemory: "DRAConsumableCapacity",
	nodegroups.Partitioned:  "DRAPartitionableDevices",
	nodegroups.Attachable:   "DRADeviceBindingConditions",
}

// Refresh probes again every mode probed so far and reports whether any answer changed, so that
// the caller re-publishes: after a control-plane upgrade that serves a mode (1.36 turns both on),
// its groups publish shared GPUs without a plugin restart. Each change is logged once; a group
// that falls back again afterwards says so again. A failed probe keeps the answer it had.
func (g *SharingGate) Refresh(ctx context.Context) bool {
	if g == nil {
		return false
	}
	g.mutex.Lock()
	defer g.mutex.Unlock()
	logger := klog.FromContext(ctx)
	changed := false
	for _, mode := range []nodegroups.SharingMode{nodegroups.SharedMemory, nodegroups.Partitioned, nodegroups.Attachable} {
		before, probed := g.probed[mode]
		if !probed {
			continue
		}
		layout := g.layout
		reason, err := g.probe(ctx, mode)
		if err != nil {
			logger.V(2).Info("Re-probing the API server failed; keeping the last answer", "mode", mode, "err", err)
			continue
		}
		g.probed[mode] = reason
		if reason == before && g.layout == layout {
			continue
		}
		changed = true
		switch {
		case reason == "" && before == "":
			// 1.34 with the gate on wants counter sets beside their devices, 1.35+ apart.
			logger.Info("API server wants partitionable devices' counter sets elsewhere now; re-publishing", "layout", g.layout)
		case reason == "":
			logger.Info("API server now serves a DRA feature; re-publishing", "feature", modeFeatures[mode], "mode", mode)
		default:
			logger.Info("API server no longer serves a DRA feature; re-publishing", "feature", modeFeatures[mode], "mode", mode, "reason", reason)
		}
		// The fallback line is said again for each group if the mode goes away again.
		for key := range g.logged {
			if strings.HasSuffix(key, "/"+string(mode)) || strings.HasSuffix(key, "/"+string(nodegroups.SharedPartitions)) {
				delete(g.logged, key)
			}
		}
	}
	return changed
}

// reason is why the API server does not keep what mode needs ("" when it does), probed once
// per mode. The caller holds the mutex.
func (g *SharingGate) reason(ctx context.Context, mode nodegroups.SharingMode) string {
	reason, probed := g.probed[mode]
	if probed {
		return reason
	}
	reason, err := g.probe(ctx, mode)
	if err != nil {
		// Not remembered: the next inventory change probes again.
		return fmt.Sprintf("cannot tell whether the API server keeps %s: %v", probedFields[mode], err)
	}
	if g.probed == nil {
		g.probed = map[nodegroups.SharingMode]string{}
	}
	g.probed[mode] = reason
	return reason
}

func (g *SharingGate) probe(ctx context.Context, mode nodegroups.SharingMode) (string, error) {
	switch mode {
	case nodegroups.SharedMemory:
		return g.ConsumableCapacity(ctx)
	case nodegroups.Attachable:
		if g.BindingConditions == nil {
			return "this plugin cannot tell whether the API server keeps bindingConditions", nil
		}
		return g.BindingConditions(ctx)
	}
	layout, reason, err := g.Partitionable(ctx)
	if before, seen := g.probed[mode]; err == nil && reason == "" && (!seen || before != "" || g.layout != layout) {
		klog.FromContext(ctx).Info("API server keeps partitionable devices", "layout", layout)
	}
	if err == nil && reason == "" {
		g.layout = layout
	}
	return reason, err
}

// Layout is where counter sets go, as the probe found; the 1.35+ layout when nothing probed (or
// on a nil gate), as then no group publishes counters through the gate.
func (g *SharingGate) Layout() CounterLayout {
	if g == nil {
		return CountersInOwnSlices
	}
	g.mutex.Lock()
	defer g.mutex.Unlock()
	return g.layout
}

func (g *SharingGate) fallBack(ctx context.Context, group string, want, to nodegroups.SharingMode, reason string) {
	if g.logged == nil {
		g.logged = map[string]bool{}
	}
	key := group + "/" + string(want)
	if g.logged[key] {
		return
	}
	g.logged[key] = true
	klog.FromContext(ctx).Info("Node group sharing falls back to "+string(to), "group", group, "want", want, "reason", reason)
}
