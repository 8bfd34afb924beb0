// Package v1alpha1 holds the opaque device configuration of this driver (GpuConfig), its defaults,
// strict decoding and validation. The kubelet plugin applies it and the webhook validates it with the
// same code, so a config the webhook admits is a config the plugin can prepare.
//
// It lives under driver/ although the webhook and kubectl dra import it: the driver owns this API
// (gpu.resource.example.com, what the plugin prepares), the others are its validators, as every
// Kubernetes component imports k8s.io/api. It is not under internal/ because it is a public contract:
// users write it in claims and DeviceClasses, and other Go programs may build or check it.
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// GroupName is the API group of the opaque parameters in ResourceClaims and DeviceClasses.
	GroupName = "gpu.resource.example.com"
	// Version is the only version of GroupName.
	Version = "v1alpha1"
	// GpuConfigKind is the kind of the one config type.
	GpuConfigKind = "GpuConfig"
)

// APIVersion is the apiVersion string every GpuConfig carries.
var APIVersion = GroupName + "/" + Version

// GpuSharingStrategy says how several containers or claims share one GPU.
type GpuSharingStrategy string

const (
	TimeSlicingStrategy       GpuSharingStrategy = "TimeSlicing"
	SpacePartitioningStrategy GpuSharingStrategy = "SpacePartitioning"
)

// TimeSliceInterval is the length of a time slice when the strategy is TimeSlicing.
type TimeSliceInterval string

const (
	DefaultTimeSlice TimeSliceInterval = "Default"
	ShortTimeSlice   TimeSliceInterval = "Short"
	MediumTimeSlice  TimeSliceInterval = "Medium"
	LongTimeSlice    TimeSliceInterval = "Long"
)

// GpuConfig is the opaque configuration a DeviceClass or ResourceClaim passes to this driver.
type GpuConfig struct {
	metav1.TypeMeta `json:",inline"`
	Sharing         *GpuSharing `json:"sharing,omitempty"`
}

// GpuSharing selects a strategy and carries the settings of that strategy only.
type GpuSharing struct {
	Strategy                GpuSharingStrategy       `json:"strategy"`
	TimeSlicingConfig       *TimeSlicingConfig       `json:"timeSlicingConfig,omitempty"`
	SpacePartitioningConfig *SpacePartitioningConfig `json:"spacePartitioningConfig,omitempty"`
}

// TimeSlicingConfig holds the TimeSlicing settings.
type TimeSlicingConfig struct {
	Interval TimeSliceInterval `json:"interval,omitempty"`
}

// SpacePartitioningConfig holds the SpacePartitioning settings.
type SpacePartitioningConfig struct {
	PartitionCount int `json:"partitionCount"`
}

// DefaultGpuConfig is what a device gets when neither its class nor its claim configures it.
func DefaultGpuConfig() *GpuConfig {
	return &GpuConfig{
		TypeMeta: metav1.TypeMeta{APIVersion: APIVersion, Kind: GpuConfigKind},
		Sharing: &GpuSharing{
			Strategy:          TimeSlicingStrategy,
			TimeSlicingConfig: &TimeSlicingConfig{Interval: DefaultTimeSlice},
		},
	}
}

// Default fills what a user may leave out, so that validation and preparation see complete settings.
func (c *GpuConfig) Default() {
	if c.Sharing == nil {
		c.Sharing = DefaultGpuConfig().Sharing
		return
	}
	if c.Sharing.Strategy == TimeSlicingStrategy {
		if c.Sharing.TimeSlicingConfig == nil {
			c.Sharing.TimeSlicingConfig = &TimeSlicingConfig{}
		}
		if c.Sharing.TimeSlicingConfig.Interval == "" {
			c.Sharing.TimeSlicingConfig.Interval = DefaultTimeSlice
		}
	}
}
