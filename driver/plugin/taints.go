package plugin

import (
	"context"
	"fmt"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/faults"
)

// ProbeDeviceTaints finds out, like ProbeConsumableCapacity, whether the API server keeps a
// device's taints in a ResourceSlice (KEP-5055: DRADeviceTaints, beta and on from 1.36; the field
// does not exist before 1.33). It returns why not ("" when it does); an error means the probe
// itself failed.
func ProbeDeviceTaints(ctx context.Context, slices SliceCreator, driverName, nodeName string) (string, error) {
	probe := probeSlice(driverName, nodeName, resourceapi.Device{
		Name:   "probe",
		Taints: []resourceapi.DeviceTaint{{Key: faults.TaintKey(driverName), Value: "probe", Effect: resourceapi.DeviceTaintEffectNoSchedule}},
	})
	got, err := slices.Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return "", fmt.Errorf("dry-run create of a ResourceSlice with a device taint: %w", err)
	}
	if len(got.Spec.Devices) != 1 || len(got.Spec.Devices[0].Taints) == 0 {
		return "API server drops devices[].taints (DRADeviceTaints off, or older than 1.33)", nil
	}
	return "", nil
}

// TaintingPublisher publishes the node's pool with the taint of each faulty device (faults.
// TaintPolicy) where the API server keeps device taints, and as it is where not (said once). It
// sits between whoever publishes the devices (start, the node-group watcher) and the kubeletplugin
// helper, and re-publishes when the faults change.
type TaintingPublisher struct {
	Publisher Publisher
	Policy    faults.TaintPolicy
	// Probe returns why the API server does not keep device taints ("" when it does); see
	// ProbeDeviceTaints. Its answer is kept once it has one, until Refresh asks again; a failed
	// probe is retried at the next publish, which publishes without taints meanwhile.
	Probe func(ctx context.Context) (string, error)

	mutex     sync.Mutex
	resources *resourceslice.DriverResources
	faults    faults.Faults
	probed    bool
	served    bool
}

var _ Publisher = &TaintingPublisher{}

// PublishResources publishes resources with the current faults' taints.
func (p *TaintingPublisher) PublishResources(ctx context.Context, resources resourceslice.DriverResources) error {
	p.mutex.Lock()
	defer p.mutex.Unlock()
	p.resources = &resources
	return p.publish(ctx)
}

// SetFaults re-publishes the last resources with the taints of faults.
func (p *TaintingPublisher) SetFaults(ctx context.Context, faults faults.Faults) error {
	p.mutex.Lock()
	defer p.mutex.Unlock()
	p.faults = faults
	if p.resources == nil {
		return nil // nothing published yet; the first publish carries them
	}
	return p.publish(ctx)
}

// Refresh asks the API server again while it did not keep device taints, and re-publishes the
// faults' taints once it does: a control-plane upgrade (1.36 turns DRADeviceTaints on) is
// followed without a plugin restart, and said once. Once served the answer is kept: a cluster is
// not downgraded under a running plugin, and a publish the API server refuses is retried by the
// library.
func (p *TaintingPublisher) Refresh(ctx context.Context) error {
	p.mutex.Lock()
	defer p.mutex.Unlock()
	if p.served || p.Probe == nil {
		return nil
	}
	wasProbed := p.probed
	reason, err := p.Probe(ctx)
	if err != nil {
		return fmt.Errorf("re-probing device taints: %w", err)
	}
	if reason != "" {
		p.probed = true
		return nil
	}
	p.probed, p.served = true, true
	if wasProbed {
		klog.FromContext(ctx).Info("API server now serves a DRA feature; device taints are published from now on", "feature", "DRADeviceTaints", "taintKey", faults.TaintKey(p.Policy.DriverName))
	}
	if p.resources == nil || len(p.faults) == 0 {
		return nil
	}
	return p.publish(ctx)
}

// TaintsServed reports whether taints are published (after the first publish).
func (p *TaintingPublisher) TaintsServed() bool {
	p.mutex.Lock()
	defer p.mutex.Unlock()
	return p.served
}

func (p *TaintingPublisher) publish(ctx context.Context) error {
	p.probe(ctx)
	if !p.served || len(p.faults) == 0 {
		return p.Publisher.PublishResources(ctx, *p.resources)
	}
	return p.Publisher.PublishResources(ctx, withTaints(*p.resources, p.faults, p.Policy))
}

func (p *TaintingPublisher) probe(ctx context.Context) {
	if p.probed {
		return
	}
	if p.Probe == nil {
		p.probed, p.served = true, true
		return
	}
	logger := klog.FromContext(ctx)
	reason, err := p.Probe(ctx)
	if err != nil {
		logger.Error(err, "Cannot tell whether the API server keeps device taints; publishing without them until the next publish")
		return
	}
	p.probed, p.served = true, reason == ""
	if !p.served {
		logger.Info("Device taints are not published: faulty devices stay allocatable; their health still reaches the kubelet (where it watches), metrics and pod Events",
			"reason", reason, "taintKey", faults.TaintKey(p.Policy.DriverName))
	}
}

// withTaints is resources with each faulty device's taint added, as copies: the caller's slices
// are kept as published without faults.
func withTaints(resources resourceslice.DriverResources, faults faults.Faults, policy faults.TaintPolicy) resourceslice.DriverResources {
	out := resourceslice.DriverResources{Pools: make(map[string]resourceslice.Pool, len(resources.Pools))}
	for name, pool := range resources.Pools {
		slices := make([]resourceslice.Slice, len(pool.Slices))
		for i, s := range pool.Slices {
			slices[i] = s
			slices[i].Devices = make([]resourceapi.Device, len(s.Devices))
			for j, dev := range s.Devices {
				if f, ok := faults[dev.Name]; ok {
					dev = *dev.DeepCopy()
					dev.Taints = append(dev.Taints, policy.Taint(f))
				}
				slices[i].Devices[j] = dev
			}
		}
		pool.Slices = slices
		out.Pools[name] = pool
	}
	return out
}
