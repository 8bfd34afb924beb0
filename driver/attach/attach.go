// Package attach attaches the GPUs of attachable node groups (KEP-5007 binding conditions). The
// scheduler allocates such a GPU, writes the allocation with the GPU's binding conditions, and
// waits before binding the pod until the driver reports the GPU attached to the node in the claim's
// status.devices; when the driver reports the attach failed instead, the scheduler drops the
// allocation and tries again, on this node or another.
//
// Attaching is simulated: it takes the node group's attach delay, counted from the allocation, and
// fails for a device with an attach-failure fault. It runs in each node's kubelet plugin, for the
// devices of its own pool only: the plugin already may write its driver's entries of status.devices
// on claims allocated to its node (RBAC plus the chart's admission policy), and nothing else is
// needed, as a hardware attach would also be done on the node.
package attach

import (
	"fmt"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	resourcev1ac "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/faults"
)

// Reasons of the conditions the attacher sets.
const (
	ReasonAttached     = "Attached"
	ReasonAttachFailed = "AttachFailed"
)

// Target is one allocated device of this driver and node that waits for its attach.
type Target struct {
	Pool, Device string
	// Conditions and FailureConditions are the device's binding conditions as the allocation
	// copied them from the slice.
	Conditions, FailureConditions []string
}

// Pending lists the devices of claim that driver must attach on node: allocated from the node's
// pool (named after the node), with binding conditions, and without any of their conditions or
// failure conditions True yet. A claim whose attach is decided has none.
func Pending(claim *resourceapi.ResourceClaim, driver, node string) []Target {
	if claim.Status.Allocation == nil || claim.DeletionTimestamp != nil {
		return nil
	}
	var out []Target
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != driver || r.Pool != node || len(r.BindingConditions) == 0 {
			continue
		}
		if decided(claim.Status.Devices, r) {
			continue
		}
		out = append(out, Target{Pool: r.Pool, Device: r.Device, Conditions: r.BindingConditions, FailureConditions: r.BindingFailureConditions})
	}
	return out
}

// decided reports whether the device's status already says attached or failed.
func decided(devices []resourceapi.AllocatedDeviceStatus, r resourceapi.DeviceRequestAllocationResult) bool {
	for _, d := range devices {
		if d.Driver != r.Driver || d.Pool != r.Pool || d.Device != r.Device {
			continue
		}
		for _, c := range d.Conditions {
			if c.Status == metav1.ConditionTrue && (slices.Contains(r.BindingConditions, c.Type) || slices.Contains(r.BindingFailureConditions, c.Type)) {
				return true
			}
		}
	}
	return false
}

// TrueCondition is the True condition of type ty of any of the claim's status.devices entries, or
// nil: whether, and why, a device of the claim was attached or failed to be.
func TrueCondition(claim *resourceapi.ResourceClaim, ty string) *metav1.Condition {
	for _, d := range claim.Status.Devices {
		if c := apimeta.FindStatusCondition(d.Conditions, ty); c != nil && c.Status == metav1.ConditionTrue {
			return c
		}
	}
	return nil
}

// Due is when the attach of a claim's devices completes: the allocation's time plus the delay.
// The scheduler stamps every allocation it waits for; one without a stamp is due now.
func Due(claim *resourceapi.ResourceClaim, delay time.Duration) time.Time {
	if a := claim.Status.Allocation; a != nil && a.AllocationTimestamp != nil {
		return a.AllocationTimestamp.Add(delay)
	}
	return time.Time{}
}

// Outcome is the conditions that report the attach of t: each binding condition True, or, when the
// device has an attach-failure fault, each failure condition True with the fault's message (a device
// without failure conditions then gets none, and the scheduler gives up at its binding timeout).
func Outcome(t Target, node string, fault *faults.Fault, now time.Time) []metav1.Condition {
	types, status := t.Conditions, metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonAttached,
		Message: fmt.Sprintf("attached to node %s", node), LastTransitionTime: metav1.NewTime(now.Truncate(time.Second))}
	if fault != nil {
		types = t.FailureConditions
		status.Reason = ReasonAttachFailed
		status.Message = fmt.Sprintf("attaching to node %s failed: %s", node, faultMessage(*fault))
	}
	out := make([]metav1.Condition, 0, len(types))
	for _, ty := range types {
		c := status
		c.Type = ty
		out = append(out, c)
	}
	return out
}

func faultMessage(f faults.Fault) string {
	if f.Message == "" {
		return string(f.Kind)
	}
	return string(f.Kind) + ": " + f.Message
}

// Result is the attach of one device, as written.
type Result struct {
	Target
	Conditions []metav1.Condition
}

// applyConfiguration is the attacher's part of the claim's status: for each device its conditions,
// under its own field manager, so that the device data the plugin records after prepare (another
// manager) stays as it is.
func applyConfiguration(namespace, name string, uid types.UID, driver string, results []Result) *resourcev1ac.ResourceClaimApplyConfiguration {
	status := resourcev1ac.ResourceClaimStatus()
	for _, r := range results {
		d := resourcev1ac.AllocatedDeviceStatus().WithDriver(driver).WithPool(r.Pool).WithDevice(r.Device)
		for _, c := range r.Conditions {
			d.WithConditions(metav1ac.Condition().WithType(c.Type).WithStatus(c.Status).WithReason(c.Reason).
				WithMessage(c.Message).WithLastTransitionTime(c.LastTransitionTime))
		}
		status.WithDevices(d)
	}
	return resourcev1ac.ResourceClaim(name, namespace).WithUID(uid).WithStatus(status)
}

// ignorable reports whether a failed write needs no retry: the claim is gone, or was deallocated
// or replaced meanwhile (the API server refuses entries for devices no longer allocated, and an
// apply for another UID); the next event of the claim brings what to do.
func ignorable(err error) bool {
	return apierrors.IsNotFound(err) || apierrors.IsInvalid(err) || apierrors.IsConflict(err)
}

func logResults(logger klog.Logger, claim klog.ObjectRef, results []Result) {
	for _, r := range results {
		reason := ReasonAttached
		if len(r.Conditions) > 0 {
			reason = r.Conditions[0].Reason
		}
		logger.Info("Attach of device decided", "claim", claim, "pool", r.Pool, "device", r.Device, "outcome", reason)
	}
}
