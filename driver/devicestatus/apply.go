package devicestatus

import (
	"context"
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	resourcev1ac "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// claimRef names one claim; the UID guards against writing into a claim that replaced it (the API
// server refuses an apply whose metadata.uid differs).
type claimRef struct {
	Namespace, Name string
	UID             types.UID
}

func (r claimRef) ref() klog.ObjectRef { return klog.KRef(r.Namespace, r.Name) }

// stored is what the API server kept of a claim's status after a write.
type stored struct {
	devices   []resourceapi.AllocatedDeviceStatus
	allocated bool
}

// applyFunc server-side applies the entries as this driver's part of the claim's status.devices.
type applyFunc func(ctx context.Context, claim claimRef, want []entry) (stored, error)

// applier returns the apply of one resource.k8s.io version. draclient (k8s.io/dynamic-resource-
// allocation/client), which the rest of the plugin uses, converts between versions but cannot
// apply. The status.devices entries have the same JSON in every version, so one body, built with
// v1's apply configuration under the version's apiVersion, serves all three; only the typed answer
// differs.
func applier(cs kubernetes.Interface, version, driver, fieldManager string) (applyFunc, error) {
	var patch func(ctx context.Context, c claimRef, body []byte, opts metav1.PatchOptions) (stored, error)
	switch version {
	case resourceversion.V1:
		patch = func(ctx context.Context, c claimRef, body []byte, opts metav1.PatchOptions) (stored, error) {
			got, err := cs.ResourceV1().ResourceClaims(c.Namespace).Patch(ctx, c.Name, types.ApplyPatchType, body, opts, "status")
			if err != nil {
				return stored{}, err
			}
			return stored{devices: got.Status.Devices, allocated: got.Status.Allocation != nil}, nil
		}
	case resourceversion.V1beta2:
		patch = func(ctx context.Context, c claimRef, body []byte, opts metav1.PatchOptions) (stored, error) {
			got, err := cs.ResourceV1beta2().ResourceClaims(c.Namespace).Patch(ctx, c.Name, types.ApplyPatchType, body, opts, "status")
			if err != nil {
				return stored{}, err
			}
			return storedAs(got.Status.Allocation != nil, got.Status.Devices, func(d resourcev1beta2.AllocatedDeviceStatus) resourceapi.AllocatedDeviceStatus {
				return v1Status(d.Driver, d.Pool, d.Device, d.ShareID, d.Data)
			}), nil
		}
	case resourceversion.V1beta1:
		patch = func(ctx context.Context, c claimRef, body []byte, opts metav1.PatchOptions) (stored, error) {
			got, err := cs.ResourceV1beta1().ResourceClaims(c.Namespace).Patch(ctx, c.Name, types.ApplyPatchType, body, opts, "status")
			if err != nil {
				return stored{}, err
			}
			return storedAs(got.Status.Allocation != nil, got.Status.Devices, func(d resourcev1beta1.AllocatedDeviceStatus) resourceapi.AllocatedDeviceStatus {
				return v1Status(d.Driver, d.Pool, d.Device, d.ShareID, d.Data)
			}), nil
		}
	default:
		return nil, fmt.Errorf("resource.k8s.io version %q: no status apply for it", version)
	}
	opts := metav1.ApplyOptions{FieldManager: fieldManager, Force: true}.ToPatchOptions()
	return func(ctx context.Context, c claimRef, want []entry) (stored, error) {
		status := resourcev1ac.ResourceClaimStatus()
		for _, e := range want {
			d := resourcev1ac.AllocatedDeviceStatus().WithDriver(driver).WithPool(e.pool).WithDevice(e.device).
				WithData(runtime.RawExtension{Raw: e.data})
			if e.shareID != "" {
				d.WithShareID(e.shareID)
			}
			status.WithDevices(d)
		}
		claim := resourcev1ac.ResourceClaim(c.Name, c.Namespace).WithAPIVersion(resourceversion.Group + "/" + version).
			WithUID(c.UID).WithStatus(status)
		body, err := json.Marshal(claim)
		if err != nil {
			return stored{}, fmt.Errorf("claim %s: encode status: %w", c.ref(), err)
		}
		return patch(ctx, c, body, opts)
	}, nil
}

// storedAs is what a beta version's answer kept, as v1 entries.
func storedAs[D any](allocated bool, devices []D, toV1 func(D) resourceapi.AllocatedDeviceStatus) stored {
	s := stored{allocated: allocated}
	for _, d := range devices {
		s.devices = append(s.devices, toV1(d))
	}
	return s
}
