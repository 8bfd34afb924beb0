package cdi

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
)

// readLegacy reads a spec written before specs carried their checkpoint entry: the claim and
// devices from the annotations, the sharing settings from the variables as that release named
// them. The names here are frozen: they describe files already on nodes, not what Spec writes.
func readLegacy(spec *cdispec.Spec, claimUID types.UID) (checkpoint.PreparedClaim, error) {
	claim := checkpoint.PreparedClaim{
		UID:       types.UID(spec.Annotations[annotationClaimUID]),
		Namespace: spec.Annotations[annotationClaimNamespace],
		Name:      spec.Annotations[annotationClaimName],
	}
	if claim.UID != claimUID || claim.Name == "" {
		return checkpoint.PreparedClaim{}, fmt.Errorf("annotations do not name claim %s", claimUID)
	}
	for _, d := range spec.Devices {
		dev := checkpoint.PreparedDevice{
			Request:     d.Annotations[annotationRequest],
			Pool:        d.Annotations[annotationPool],
			Device:      d.Annotations[annotationDevice],
			AdminAccess: d.Annotations[annotationAdminAccess] == "true",
			CDIDevice:   d.Name,
		}
		if dev.Device == "" || dev.Pool == "" {
			return checkpoint.PreparedClaim{}, fmt.Errorf("device %s lacks pool or device annotation", d.Name)
		}
		if _, err := fmt.Sscanf(dev.Device, "gpu-%d", &dev.Index); err != nil {
			return checkpoint.PreparedClaim{}, fmt.Errorf("device %q is not gpu-<index>", dev.Device)
		}
		prefix := fmt.Sprintf("GPU_DEVICE_%d_", dev.Index)
		for _, e := range d.ContainerEdits.Env {
			k, v, _ := strings.Cut(e, "=")
			switch k {
			case prefix + "SHARING_STRATEGY":
				dev.Sharing.Strategy = v
			case prefix + "TIMESLICE_INTERVAL":
				dev.Sharing.TimeSliceInterval = v
			case prefix + "PARTITION_COUNT":
				_, _ = fmt.Sscanf(v, "%d", &dev.Sharing.PartitionCount)
			}
		}
		claim.Devices = append(claim.Devices, dev)
	}
	return claim, nil
}
