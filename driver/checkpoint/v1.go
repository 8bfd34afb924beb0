package checkpoint

import (
	"k8s.io/apimachinery/pkg/types"
)

// The v1 format stored the CDI package's claim type as it was then. These types freeze it, so
// that v1 files keep their meaning whatever happens to the CDI package.
type dataV1 struct {
	BootID string                `json:"bootID,omitempty"`
	Claims map[types.UID]claimV1 `json:"claims"`
}

type claimV1 struct {
	UID       types.UID  `json:"uid"`
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	Devices   []deviceV1 `json:"devices"`
}

type deviceV1 struct {
	Request     string    `json:"request"`
	Pool        string    `json:"pool"`
	Name        string    `json:"name"`
	Index       int       `json:"index"`
	Sharing     sharingV1 `json:"sharing"`
	AdminAccess bool      `json:"adminAccess,omitempty"`
}

type sharingV1 struct {
	Strategy          string `json:"strategy"`
	TimeSliceInterval string `json:"timeSliceInterval,omitempty"`
	PartitionCount    int    `json:"partitionCount,omitempty"`
}

func (d *dataV1) convert() *Data {
	out := &Data{BootID: d.BootID, Claims: make(map[types.UID]PreparedClaim, len(d.Claims))}
	for uid, c := range d.Claims {
		pc := PreparedClaim{UID: c.UID, Namespace: c.Namespace, Name: c.Name}
		for _, dev := range c.Devices {
			pc.Devices = append(pc.Devices, PreparedDevice{
				Request:     dev.Request,
				Pool:        dev.Pool,
				Device:      dev.Name,
				Index:       dev.Index,
				AdminAccess: dev.AdminAccess,
				Sharing:     Sharing(dev.Sharing),
				// v1 plugins named every CDI device <claim UID>-<device>.
				CDIDevice: string(c.UID) + "-" + dev.Name,
			})
		}
		out.Claims[uid] = pc
	}
	return out
}
