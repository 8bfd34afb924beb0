package devicestatus

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	resourcev1ac "k8s.io/client-go/applyconfigurations/resource/v1"
	resourcev1beta1ac "k8s.io/client-go/applyconfigurations/resource/v1beta1"
	resourcev1beta2ac "k8s.io/client-go/applyconfigurations/resource/v1beta2"
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
// apply; so each version has its own typed apply configuration here. Their JSON is the same.
func applier(cs kubernetes.Interface, version, driver, fieldManager string) (applyFunc, error) {
	opts := metav1.ApplyOptions{FieldManager: fieldManager, Force: true}
	switch version {
	case resourceversion.V1:
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
			got, err := cs.ResourceV1().ResourceClaims(c.Namespace).ApplyStatus(ctx,
				resourcev1ac.ResourceClaim(c.Name, c.Namespace).WithUID(c.UID).WithStatus(status), opts)
			if err != nil {
				return stored{}, err
			}
			return stored{devices: got.Status.Devices, allocated: got.Status.Allocation != nil}, nil
		}, nil
	case resourceversion.V1beta2:
		return func(ctx context.Context, c claimRef, want []entry) (stored, error) {
			status := resourcev1beta2ac.ResourceClaimStatus()
			for _, e := range want {
				d := resourcev1beta2ac.AllocatedDeviceStatus().WithDriver(driver).WithPool(e.pool).WithDevice(e.device).
					WithData(runtime.RawExtension{Raw: e.data})
				if e.shareID != "" {
					d.WithShareID(e.shareID)
				}
				status.WithDevices(d)
			}
			got, err := cs.ResourceV1beta2().ResourceClaims(c.Namespace).ApplyStatus(ctx,
				resourcev1beta2ac.ResourceClaim(c.Name, c.Namespace).WithUID(c.UID).WithStatus(status), opts)
			if err != nil {
				return stored{}, err
			}
			s := stored{allocated: got.Status.Allocation != nil}
			for _, d := range got.Status.Devices {
				s.devices = append(s.devices, v1Status(d.Driver, d.Pool, d.Device, d.ShareID, d.Data))
			}
			return s, nil
		}, nil
	case resourceversion.V1beta1:
		return func(ctx context.Context, c claimRef, want []entry) (stored, error) {
			status := resourcev1beta1ac.ResourceClaimStatus()
			for _, e := range want {
				d := resourcev1beta1ac.AllocatedDeviceStatus().WithDriver(driver).WithPool(e.pool).WithDevice(e.device).
					WithData(runtime.RawExtension{Raw: e.data})
				if e.shareID != "" {
					d.WithShareID(e.shareID)
				}
				status.WithDevices(d)
			}
			got, err := cs.ResourceV1beta1().ResourceClaims(c.Namespace).ApplyStatus(ctx,
				resourcev1beta1ac.ResourceClaim(c.Name, c.Namespace).WithUID(c.UID).WithStatus(status), opts)
			if err != nil {
				return stored{}, err
			}
			s := stored{allocated: got.Status.Allocation != nil}
			for _, d := range got.Status.Devices {
				s.devices = append(s.devices, v1Status(d.Driver, d.Pool, d.Device, d.ShareID, d.Data))
			}
			return s, nil
		}, nil
	}
	return nil, fmt.Errorf("resource.k8s.io version %q: no status apply for it", version)
}
