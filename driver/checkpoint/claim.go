package checkpoint

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
)

// version is the format this package writes (see decoders for those it reads).
const version = "gpu.example.com/checkpoint/v2"

// PreparedClaim is one prepared claim as this plugin recorded it: enough to answer a repeated
// prepare with the same result, to write its CDI spec again, and to find the claim for unprepare
// and cleanup. It is the plugin's own record, versioned with the file: the CDI spec is rendered
// from it, never parsed back into it, so the environment a container sees can change without
// changing what a restarted plugin believes is prepared.
type PreparedClaim struct {
	UID       types.UID        `json:"uid"`
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	Devices   []PreparedDevice `json:"devices"`
}

// PreparedDevice is one device allocated to a prepared claim. A claim lists each allocation
// result of this driver once, so a later allocation of part of a device (a share: its share ID
// and consumed capacity) is one more entry with new optional fields; entries without them are
// whole devices, and entries of this version decode unchanged.
type PreparedDevice struct {
	// Request is the request, or request/subrequest, the device was allocated for.
	Request string `json:"request"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	// Index is the device's index at prepare time; the container's variables are numbered by it.
	Index int `json:"index"`
	// AdminAccess devices may be in use by other claims at the same time (monitoring, debugging).
	AdminAccess bool    `json:"adminAccess,omitempty"`
	Sharing     Sharing `json:"sharing"`
	// CDIDevice is the device's name in the claim's CDI spec, as handed to the kubelet (qualified
	// with the driver's CDI kind). Recorded rather than derived, so that a changed naming scheme
	// applies to new claims only.
	CDIDevice string `json:"cdiDevice"`
	// ShareID is set when the device is shared (allowMultipleAllocations): this entry is one
	// share of it, and ConsumedCapacity is what the share takes of the device's capacities.
	ShareID          string                       `json:"shareID,omitempty"`
	ConsumedCapacity map[string]resource.Quantity `json:"consumedCapacity,omitempty"`
	// Capacity is set when the device is part of a partitionable GPU (a partition or the whole
	// GPU): its capacities as published when prepared, which its container sees.
	Capacity map[string]resource.Quantity `json:"capacity,omitempty"`
}

// AdminAccess reports whether any device of the claim was allocated with admin access.
func (c PreparedClaim) AdminAccess() bool {
	for _, d := range c.Devices {
		if d.AdminAccess {
			return true
		}
	}
	return false
}

// Sharing is how a device is shared, with the GpuConfig's defaults applied.
type Sharing struct {
	Strategy          string `json:"strategy"`
	TimeSliceInterval string `json:"timeSliceInterval,omitempty"`
	PartitionCount    int    `json:"partitionCount,omitempty"`
}

// record is one PreparedClaim kept outside the checkpoint, with the format version.
type record struct {
	Version string        `json:"version"`
	Claim   PreparedClaim `json:"claim"`
}

// EncodeClaim encodes one entry in the current format, for a copy kept next to what it describes:
// each CDI spec carries its claim's entry, from which a lost checkpoint is rebuilt.
func EncodeClaim(c PreparedClaim) (string, error) {
	raw, err := json.Marshal(record{Version: version, Claim: c})
	if err != nil {
		return "", fmt.Errorf("encode checkpoint entry of claim %s: %w", c.UID, err)
	}
	return string(raw), nil
}

// DecodeClaim reads what EncodeClaim wrote.
func DecodeClaim(s string) (PreparedClaim, error) {
	var r record
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return PreparedClaim{}, fmt.Errorf("checkpoint entry: not JSON: %w", err)
	}
	if r.Version != version {
		return PreparedClaim{}, fmt.Errorf("checkpoint entry: version %q, want %q", r.Version, version)
	}
	return r.Claim, nil
}
