package plugin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/faults"
)

// HealthTracker is what the driver reads of the node's faults (faults.Tracker implements it).
type HealthTracker interface {
	Faults() faults.Faults
	// Subscribe returns a channel that receives after each change, and its cancel function.
	Subscribe() (<-chan struct{}, func())
}

// WithHealth streams the tracker's faults to the kubelet (WatchHealthStatus); without it the
// driver declines health reporting.
func WithHealth(t HealthTracker) DriverOption { return func(d *Driver) { d.health = t } }

// healthResend is how often the whole report is sent again although nothing changed: the kubelet
// reports a device's health as unknown once its last report is older than the health check
// timeout (30 s by default).
const healthResend = 10 * time.Second

// WatchHealthStatus sends every published device's health (KEP-4680): at once, after every change
// of the faults and every healthResend. The kubelet shows it in the status of the containers
// using the device (allocatedResourcesStatus) where ResourceHealthStatus is on (beta and on from
// 1.36); older kubelets never call it.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	if d.health == nil {
		return kubeletplugin.ErrHealthNotSupported
	}
	changed, cancel := d.health.Subscribe()
	defer cancel()
	ticker := time.NewTicker(healthResend)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case reports <- d.healthReport(d.health.Faults().Unhealthy(), time.Now()):
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-ticker.C:
		}
	}
}

// healthReport covers every published device: unhealthy with the fault's kind and message since
// its time, healthy as of now otherwise.
func (d *Driver) healthReport(faults faults.Faults, now time.Time) kubeletplugin.DeviceHealthReport {
	d.mutex.RLock()
	names := slices.Sorted(maps.Keys(d.attributes))
	d.mutex.RUnlock()
	report := kubeletplugin.DeviceHealthReport{Devices: make([]kubeletplugin.DeviceHealth, 0, len(names))}
	for _, name := range names {
		h := kubeletplugin.DeviceHealth{PoolName: d.poolName, DeviceName: name, Health: kubeletplugin.HealthStatusHealthy, LastUpdated: now}
		if f, ok := faults[name]; ok {
			h.Health, h.LastUpdated, h.Message = kubeletplugin.HealthStatusUnhealthy, f.Time.Time, faultText(f)
		}
		report.Devices = append(report.Devices, h)
	}
	return report
}

func faultText(f faults.Fault) string {
	if f.Message == "" {
		return string(f.Kind)
	}
	return string(f.Kind) + ": " + f.Message
}

// Event reasons on pods.
const (
	ReasonDeviceUnhealthy = "DeviceUnhealthy"
	ReasonDeviceRecovered = "DeviceRecovered"
)

// maxEventPods bounds the Events one change sends: a node has few GPUs, but a shared one can be
// reserved for many pods.
const maxEventPods = 256

// notifyTimeout bounds the claim reads of one change's Events.
const notifyTimeout = 30 * time.Second

// NotifyPods puts an Event on every pod that uses a device whose health changed between before and
// after: Warning DeviceUnhealthy when it turned faulty (or its fault changed), Normal
// DeviceRecovered when its fault was cleared. The pods are those the prepared claims holding the
// device are reserved for, read from the API server. The recorder rate-limits them per pod, device
// and reason (NewEventBroadcaster), so a flapping fault does not flood the API server.
func (d *Driver) NotifyPods(ctx context.Context, claims ClaimGetter, recorder EventRecorder, before, after faults.Faults) {
	logger := klog.FromContext(ctx)
	changed := map[string]bool{}
	for dev, f := range after {
		if b, ok := before[dev]; !ok || b.Kind != f.Kind || b.Message != f.Message {
			changed[dev] = true
		}
	}
	for dev := range before {
		if _, ok := after[dev]; !ok {
			changed[dev] = true
		}
	}
	if len(changed) == 0 {
		return
	}
	// The tracker's next change waits for this one: bound the claim reads.
	ctx, cancel := context.WithTimeout(ctx, notifyTimeout)
	defer cancel()
	prepared, err := d.PreparedClaims(ctx)
	if err != nil {
		logger.Error(err, "No pod Events for changed device health: the checkpoint is unreadable")
		return
	}
	sent := 0
	for _, c := range prepared {
		var devs []string
		for _, dev := range c.Devices {
			if changed[dev.Device] && !slices.Contains(devs, dev.Device) {
				devs = append(devs, dev.Device)
			}
		}
		if len(devs) == 0 {
			continue
		}
		claim, err := claims.ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
		if err != nil || claim.UID != c.UID {
			logger.V(2).Info("No pod Events for a prepared claim: cannot read it", "claim", klog.KRef(c.Namespace, c.Name), "err", err)
			continue
		}
		for _, ref := range claim.Status.ReservedFor {
			if ref.Resource != "pods" || ref.APIGroup != "" {
				continue
			}
			if sent == maxEventPods {
				logger.Info("Pod Events for changed device health capped", "max", maxEventPods)
				return
			}
			sent++
			pod := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: c.Namespace, Name: ref.Name, UID: ref.UID}
			for _, dev := range devs {
				// The device is part of the Events' rate limit key (NewEventBroadcaster).
				annotations := map[string]string{d.driverName + "/device": d.poolName + "/" + dev}
				if f, faulty := after[dev]; faulty {
					recorder.AnnotatedEventf(pod, annotations, corev1.EventTypeWarning, ReasonDeviceUnhealthy,
						"%s device %s/%s of claim %s is unhealthy: %s", d.driverName, d.poolName, dev, c.Name, faultText(f))
				} else {
					recorder.AnnotatedEventf(pod, annotations, corev1.EventTypeNormal, ReasonDeviceRecovered,
						"%s device %s/%s of claim %s is healthy again", d.driverName, d.poolName, dev, c.Name)
				}
			}
		}
	}
	if sent > 0 {
		logger.V(2).Info("Told pods about changed device health", "pods", sent, "devices", fmt.Sprint(slices.Sorted(maps.Keys(changed))))
	}
}
