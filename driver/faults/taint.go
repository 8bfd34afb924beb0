package faults

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TaintKey is the key of the taint a fault becomes, in the driver's domain:
// gpu.example.com/unhealthy, the key the reference driver's device-taint demos tolerate.
func TaintKey(driverName string) string { return driverName + "/unhealthy" }

// TaintPolicy says which taint a fault becomes: key TaintKey, value the fault's kind, effect
// NoSchedule (new claims stay off the device, running pods stay) or NoExecute for the kinds listed
// (the eviction controller also evicts the pods using the device that do not tolerate it), added
// at the fault's time.
type TaintPolicy struct {
	DriverName     string
	NoExecuteKinds []Kind
}

// Taint is the taint of f.
func (p TaintPolicy) Taint(f Fault) resourceapi.DeviceTaint {
	effect := resourceapi.DeviceTaintEffectNoSchedule
	if slices.Contains(p.NoExecuteKinds, f.Kind) {
		effect = resourceapi.DeviceTaintEffectNoExecute
	}
	added := metav1.NewTime(f.Time.Rfc3339Copy().Time)
	return resourceapi.DeviceTaint{Key: TaintKey(p.DriverName), Value: string(f.Kind), Effect: effect, TimeAdded: &added}
}
