package app

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/faults"
	"github.com/gpu-dra/gpu-dra/driver/plugin"
)

// newHealth makes the node's fault tracker and the publisher that turns faults into taints. The
// tracker's source is the node's own faults ConfigMap when faults are configured; without them no
// device ever becomes faulty (a hardware backend would be another faults.Source).
func (p *instance) newHealth() {
	var source faults.Source = noFaults{}
	if p.o.FaultsConfigMap != "" {
		ns, name := splitNamespaced(p.o.FaultsConfigMap)
		source = &faults.ConfigMapSource{
			Client: p.client, Namespace: ns, Name: name, NodeName: p.o.NodeName,
			// The driver exists by the time the tracker runs (startHealth).
			Known: func(dev string) bool { return p.driver.HasDevice(dev) },
		}
	}
	p.health = faults.NewTracker(source)
	p.publisher = &plugin.TaintingPublisher{
		Policy: faults.TaintPolicy{DriverName: p.o.DriverName, NoExecuteKinds: p.o.noExecuteKinds()},
		Probe: func(ctx context.Context) (string, error) {
			return plugin.ProbeDeviceTaints(ctx, p.resourceClient.ResourceSlices(), p.o.DriverName, p.o.NodeName)
		},
	}
}

// startHealth runs the tracker once the helper publishes: each change of the faults re-publishes
// the taints, updates the metrics and tells the pods using the devices.
func (p *instance) startHealth(ctx context.Context) {
	logger := klog.FromContext(ctx)
	// core/v1 Events, rate-limited per pod, device and reason as the kubelet's are.
	broadcaster := plugin.NewEventBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: p.client.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "gpu-kubelet-plugin", Host: p.o.NodeName}).WithLogger(logger)
	p.updateHealthMetrics(faults.Faults{})
	p.health.OnChange(func(ctx context.Context, before, after faults.Faults) {
		// An attach failure leaves its device healthy: it only fails the device's attaches.
		if err := p.publisher.SetFaults(ctx, after.Unhealthy()); err != nil {
			klog.FromContext(ctx).Error(err, "Re-publishing device taints failed; retried at the next change")
		}
		p.updateHealthMetrics(after)
		p.driver.NotifyPods(ctx, p.resourceClient, recorder, before.Unhealthy(), after.Unhealthy())
	})
	healthCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := p.health.Run(healthCtx); err != nil {
			logger.Error(err, "Device health source stopped; devices keep the health they had")
		}
	}()
	p.stopFaults = func() { cancel(); <-done; broadcaster.Shutdown() }
}

// updateHealthMetrics counts the faults that make devices unhealthy; an attach failure leaves its
// device healthy and is not one.
func (p *instance) updateHealthMetrics(current faults.Faults) {
	byKind := map[string]int{}
	for _, f := range current.Unhealthy() {
		byKind[string(f.Kind)]++
	}
	p.metrics.SetDeviceHealth(p.driver.DeviceCount(), byKind, faults.UnhealthyKindNames())
}

// noFaults is the source of a plugin without a faults ConfigMap.
type noFaults struct{}

func (noFaults) Run(ctx context.Context, _ func(faults.Faults)) error {
	<-ctx.Done()
	return nil
}
