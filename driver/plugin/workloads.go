package plugin

import (
	"strconv"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
	"github.com/gpu-dra/gpu-dra/driver/metrics"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

// recordPrepared hands the metrics what the checkpoint says is prepared now.
func (d *Driver) recordPrepared(data *checkpoint.Data) {
	var devs []metrics.PreparedDevice
	for _, c := range data.Claims {
		for _, dev := range c.Devices {
			devs = append(devs, metrics.PreparedDevice{Namespace: c.Namespace, Claim: c.Name, Request: dev.Request,
				Device: dev.Device, ShareID: dev.ShareID})
		}
	}
	d.metrics.SetPrepared(len(data.Claims), devs)
}

// deviceInfos are the identities of the published devices. A partition carries its GPU's uuid,
// which is what a per-GPU exporter labels its series with.
func deviceInfos(devs []resourceapi.Device) []metrics.DeviceInfo {
	out := make([]metrics.DeviceInfo, 0, len(devs))
	for _, dev := range devs {
		info := metrics.DeviceInfo{Device: dev.Name, UUID: stringAttr(dev, deviceschema.AttrUUID), Model: stringAttr(dev, deviceschema.AttrModel)}
		if a, ok := dev.Attributes[deviceschema.AttrPartition]; ok && a.IntValue != nil {
			info.Partition = strconv.FormatInt(*a.IntValue, 10)
		} else if a, ok := dev.Attributes[deviceschema.AttrFull]; ok && a.BoolValue != nil && *a.BoolValue {
			info.Partition = "full"
		}
		out = append(out, info)
	}
	return out
}

func stringAttr(dev resourceapi.Device, name resourceapi.QualifiedName) string {
	if a, ok := dev.Attributes[name]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}
