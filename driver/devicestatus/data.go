package devicestatus

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

// DataAttributes are the published attributes a device's status data repeats: what tells one GPU
// from another (uuid, index) and what it is (model, driverVersion). The reference driver records
// uuid, model and driverVersion; index is ours, because GPU_DEVICE_<index> is how a container
// names the device.
var DataAttributes = []resourceapi.QualifiedName{
	deviceschema.AttrUUID, deviceschema.AttrModel, deviceschema.AttrIndex, deviceschema.AttrDriverVersion,
}

// MaxDataBytes is the API server's limit on one device's status data.
const MaxDataBytes = resourceapi.AllocatedDeviceStatusDataMaxLength

// Device is one prepared device of a claim and the attributes it publishes.
type Device struct {
	Pool, Name string
	// ShareID names the share of a shared device (KEP-5075) the claim got; empty for a whole
	// device. The API server keys status entries by it.
	ShareID    string
	Attributes map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
}

// Data is a device's status data: a JSON object of DeviceAttribute values, one per DataAttributes
// entry the device publishes, e.g.
//
//	{"driverVersion":{"version":"1.0.0"},"index":{"int":3},"model":{"string":"LATEST-GPU-MODEL"},"uuid":{"string":"gpu-…"}}
//
// so a reader decodes it with the same type as the ResourceSlice's attributes. Keys are sorted, so
// the same device always gives the same bytes. It returns nil when the device publishes none of
// them, and an error when the object exceeds what the API server stores.
func Data(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) ([]byte, error) {
	picked := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(DataAttributes))
	for _, name := range DataAttributes {
		if a, ok := attrs[name]; ok {
			picked[name] = a
		}
	}
	if len(picked) == 0 {
		return nil, nil
	}
	raw, err := json.Marshal(picked)
	if err != nil {
		return nil, fmt.Errorf("encode attributes: %w", err)
	}
	if len(raw) > MaxDataBytes {
		return nil, fmt.Errorf("status data of %d bytes exceeds the API server's limit of %d", len(raw), MaxDataBytes)
	}
	return raw, nil
}

// entry is one device's status as this driver writes it; shareID is set for a share.
type entry struct {
	pool, device, shareID string
	data                  []byte
}

// entries are the status entries of a claim's devices. A device without data gets none: an entry
// naming a device without saying anything about it is noise. Errors name the device.
func entries(devices []Device) ([]entry, error) {
	out := make([]entry, 0, len(devices))
	var errs []error
	for _, d := range devices {
		data, err := Data(d.Attributes)
		if err != nil {
			errs = append(errs, fmt.Errorf("device %s/%s: %w", d.Pool, d.Name, err))
			continue
		}
		if data != nil {
			out = append(out, entry{pool: d.Pool, device: d.Name, shareID: d.ShareID, data: data})
		}
	}
	return out, errors.Join(errs...)
}

// recorded reports whether observed, a claim's status.devices, already holds every wanted entry
// of driver with the same data. Data is compared as JSON values: the API server may hand back the
// object re-encoded.
func recorded(driver string, observed []resourceapi.AllocatedDeviceStatus, want []entry) bool {
	for _, e := range want {
		found := false
		for _, o := range observed {
			if o.Driver != driver || o.Pool != e.pool || o.Device != e.device || ptr.Deref(o.ShareID, "") != e.shareID {
				continue
			}
			found = o.Data != nil && sameJSON(o.Data.Raw, e.data)
			break
		}
		if !found {
			return false
		}
	}
	return true
}

func sameJSON(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// v1Status is the common form of the status entries every served version returns (their JSON is
// the same in v1, v1beta2 and v1beta1).
func v1Status(driver, pool, device string, shareID *string, data *runtime.RawExtension) resourceapi.AllocatedDeviceStatus {
	return resourceapi.AllocatedDeviceStatus{Driver: driver, Pool: pool, Device: device, ShareID: shareID, Data: data}
}
