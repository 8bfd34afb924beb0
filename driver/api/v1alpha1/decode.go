package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/json"
)

// Decode reads opaque parameters strictly: unknown or duplicate fields, a wrong apiVersion or kind,
// and invalid settings are errors that name the field under path. The result is defaulted.
func Decode(raw []byte, path *field.Path) (*GpuConfig, field.ErrorList) {
	var cfg GpuConfig
	strictErrs, err := json.UnmarshalStrict(raw, &cfg)
	if err != nil {
		return nil, field.ErrorList{field.Invalid(path, "<opaque parameters>", fmt.Sprintf("not a valid %s: %v", GpuConfigKind, err))}
	}
	var errs field.ErrorList
	for _, se := range strictErrs {
		errs = append(errs, field.Invalid(path, "<opaque parameters>", fmt.Sprintf("%v; remove it or fix its spelling (fields: sharing.strategy, sharing.timeSlicingConfig.interval, sharing.spacePartitioningConfig.partitionCount)", se)))
	}
	if cfg.APIVersion != APIVersion {
		errs = append(errs, field.Invalid(path.Child("apiVersion"), cfg.APIVersion, fmt.Sprintf("must be %q", APIVersion)))
	}
	if cfg.Kind != GpuConfigKind {
		errs = append(errs, field.Invalid(path.Child("kind"), cfg.Kind, fmt.Sprintf("must be %q", GpuConfigKind)))
	}
	cfg.Default()
	errs = append(errs, cfg.Validate(path)...)
	if len(errs) > 0 {
		return nil, errs
	}
	return &cfg, nil
}

// Validate checks a defaulted config. Field paths are relative to path (the opaque parameters).
func (c *GpuConfig) Validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if c.Sharing == nil {
		return errs
	}
	sp := path.Child("sharing")
	s := c.Sharing
	switch s.Strategy {
	case TimeSlicingStrategy:
		if s.SpacePartitioningConfig != nil {
			errs = append(errs, field.Forbidden(sp.Child("spacePartitioningConfig"), "only allowed with strategy SpacePartitioning; remove it or change the strategy"))
		}
		if s.TimeSlicingConfig != nil {
			switch s.TimeSlicingConfig.Interval {
			case DefaultTimeSlice, ShortTimeSlice, MediumTimeSlice, LongTimeSlice:
			default:
				errs = append(errs, field.NotSupported(sp.Child("timeSlicingConfig", "interval"), s.TimeSlicingConfig.Interval,
					[]string{string(DefaultTimeSlice), string(ShortTimeSlice), string(MediumTimeSlice), string(LongTimeSlice)}))
			}
		}
	case SpacePartitioningStrategy:
		if s.TimeSlicingConfig != nil {
			errs = append(errs, field.Forbidden(sp.Child("timeSlicingConfig"), "only allowed with strategy TimeSlicing; remove it or change the strategy"))
		}
		if s.SpacePartitioningConfig == nil {
			errs = append(errs, field.Required(sp.Child("spacePartitioningConfig", "partitionCount"), "SpacePartitioning needs a partitionCount of at least 1"))
		} else if s.SpacePartitioningConfig.PartitionCount < 1 {
			errs = append(errs, field.Invalid(sp.Child("spacePartitioningConfig", "partitionCount"), s.SpacePartitioningConfig.PartitionCount, "must be at least 1"))
		}
	case "":
		errs = append(errs, field.Required(sp.Child("strategy"), "set TimeSlicing or SpacePartitioning"))
	default:
		errs = append(errs, field.NotSupported(sp.Child("strategy"), s.Strategy, []string{string(TimeSlicingStrategy), string(SpacePartitioningStrategy)}))
	}
	return errs
}
