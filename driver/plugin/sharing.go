package plugin

import (
	"context"
	"fmt"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
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
	probe := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: nodeName + "-probe-"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driverName,
			NodeName: ptr.To(nodeName),
			Pool:     resourceapi.ResourcePool{Name: nodeName + "-probe", ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{
				Name:                     "probe",
				AllowMultipleAllocations: ptr.To(true),
				Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
					deviceschema.CapMemory: {Value: one, RequestPolicy: &resourceapi.CapacityRequestPolicy{
						Default:    ptr.To(one.DeepCopy()),
						ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(one.DeepCopy())},
					}},
				},
			}},
		},
	}
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

// SharingGate decides what a node group publishes: its sharing mode where the API server keeps
// the fields the mode needs, else exclusive, said once per node group. The probe runs once, before
// the first publish of a mode that needs it, and its answer is kept: a feature gate changes only
// with an API server restart, and the library's dropped-fields check catches that case.
type SharingGate struct {
	// Probe returns why consumable capacity is not kept ("" when it is).
	Probe func(ctx context.Context) (string, error)

	mutex  sync.Mutex
	probed bool
	reason string
	logged map[string]bool
}

// Effective is the spec to publish for the named group.
func (g *SharingGate) Effective(ctx context.Context, group string, spec nodegroups.GroupSpec) nodegroups.GroupSpec {
	want := spec.ModeOf()
	if want == nodegroups.Exclusive {
		return spec
	}
	g.mutex.Lock()
	defer g.mutex.Unlock()
	reason := g.reason
	if !g.probed {
		r, err := g.Probe(ctx)
		if err != nil {
			// Not remembered: the next inventory change probes again.
			reason = fmt.Sprintf("cannot tell whether the API server keeps allowMultipleAllocations: %v", err)
		} else {
			g.probed, g.reason, reason = true, r, r
		}
	}
	if reason == "" {
		return spec
	}
	g.fallBack(ctx, group, want, reason)
	spec.Sharing = &nodegroups.Sharing{Mode: nodegroups.Exclusive}
	return spec
}

func (g *SharingGate) fallBack(ctx context.Context, group string, want nodegroups.SharingMode, reason string) {
	if g.logged == nil {
		g.logged = map[string]bool{}
	}
	if g.logged[group] {
		return
	}
	g.logged[group] = true
	klog.FromContext(ctx).Info("Node group sharing falls back to exclusive", "group", group, "want", want, "reason", reason)
}
