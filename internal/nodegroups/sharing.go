package nodegroups

import (
	"encoding/json"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// SharingMode is how the GPUs of a node group are handed out.
type SharingMode string

const (
	// Exclusive GPUs go whole to one claim each (the default, and what every cluster serves).
	Exclusive SharingMode = "exclusive"
	// SharedMemory GPUs may be allocated to several claims at once (KEP-5075 consumable
	// capacity): each claim gets a share of the GPU's memory and compute, and the scheduler keeps
	// the sum of the shares within the GPU.
	SharedMemory SharingMode = "shared-memory"
	// Partitioned GPUs are partitionable devices (KEP-4815): each GPU is a set of counters
	// (memory, compute) that Partitions equal partition devices and one whole-GPU device consume,
	// so the scheduler hands out either partitions or the whole GPU, never both.
	Partitioned SharingMode = "partitioned"
	// SharedPartitions GPUs are partitioned GPUs whose partitions (and whole GPU) several claims
	// may share, each claim asking for part of one partition's memory and compute (KEP-4815 with
	// KEP-5075): the counters still keep a GPU's partitions and its whole device apart, and each
	// device's shares within its capacity.
	SharedPartitions SharingMode = "shared-partitions"
	// Attachable GPUs are whole GPUs that must be attached to the node before a pod may use them
	// (KEP-5007 binding conditions): the scheduler allocates one, waits before binding the pod
	// until the plugin reports it attached, and allocates again when attaching fails.
	Attachable SharingMode = "attachable"
)

// Attach delays: how long a simulated attach takes by default, and the most a group may ask for
// (the scheduler gives up waiting after 10 minutes by default).
const (
	DefaultAttachDelay = 2 * time.Second
	MaxAttachDelay     = 5 * time.Minute
)

// Partitions reports whether the mode cuts GPUs into partitions.
func (m SharingMode) Partitions() bool { return m == Partitioned || m == SharedPartitions }

// Shares reports whether the mode lets several claims share one device.
func (m SharingMode) Shares() bool { return m == SharedMemory || m == SharedPartitions }

// PartOf is one of n equal parts of a GPU's capacity, rounded down so that the parts always fit
// together.
func PartOf(total resource.Quantity, n int) resource.Quantity {
	if total.Format == resource.BinarySI {
		return *resource.NewQuantity(total.Value()/int64(n), resource.BinarySI)
	}
	return *resource.NewQuantity(total.Value()/int64(n), resource.DecimalSI)
}

// MaxPartitions is the most partitions of one GPU: with the whole-GPU device, 17 devices per
// GPU still fit three GPUs in a slice of 64 devices (the API server's limit once devices consume
// counters).
const MaxPartitions = 16

// Sharing is a node group's sharing mode and, for shared-memory and shared-partitions, what one
// share may be; for partitioned and shared-partitions, into how many partitions each GPU is cut.
type Sharing struct {
	Mode SharingMode `json:"mode,omitempty"`
	// Partitions is the number of equal partitions of each GPU in modes partitioned and
	// shared-partitions (1..16).
	Partitions int `json:"partitions,omitempty"`
	// Memory and Compute bound the share of each capacity a claim may request; unset fields take
	// DefaultMemoryPolicy and DefaultComputePolicy.
	Memory  *CapacityPolicy `json:"memory,omitempty"`
	Compute *CapacityPolicy `json:"compute,omitempty"`
	// AttachDelay is how long attaching one GPU takes in mode attachable (default
	// DefaultAttachDelay, at most MaxAttachDelay).
	AttachDelay *AttachDelay `json:"attachDelay,omitempty"`
}

// AttachDelay is a duration as Go writes it (5s, 1m30s); a value that is none is refused naming
// the field, which the config decoder's own error would not.
type AttachDelay struct{ time.Duration }

// UnmarshalJSON reads a quoted duration; its length is bounded by the config file's.
func (d *AttachDelay) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("attachDelay: %s is not a duration; write one such as 5s", data)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("attachDelay: %q is not a duration; write one such as 5s", s)
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes the duration as UnmarshalJSON reads it.
func (d AttachDelay) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// AttachDelayOf is the group's attach delay with the default filled in.
func (s *Sharing) AttachDelayOf() time.Duration {
	if s == nil || s.AttachDelay == nil {
		return DefaultAttachDelay
	}
	return s.AttachDelay.Duration
}

// CapacityPolicy is a capacity's request policy: a request is rounded up to Min plus a multiple of
// Step and may not exceed Max (the GPU's whole capacity when unset). A claim that names no amount
// gets the whole GPU's, as with the reference driver.
type CapacityPolicy struct {
	Min  *resource.Quantity `json:"min,omitempty"`
	Step *resource.Quantity `json:"step,omitempty"`
	Max  *resource.Quantity `json:"max,omitempty"`
}

// Default policies, as the upstream reference driver publishes them.
var (
	DefaultMemoryPolicy  = CapacityPolicy{Min: ptrTo(resource.MustParse("1Gi")), Step: ptrTo(resource.MustParse("1Gi"))}
	DefaultComputePolicy = CapacityPolicy{Min: ptrTo(resource.MustParse("1")), Step: ptrTo(resource.MustParse("1"))}
)

func ptrTo[T any](v T) *T { return &v }

// ModeOf is the sharing mode of a spec, exclusive when unset.
func (g GroupSpec) ModeOf() SharingMode {
	if g.Sharing == nil || g.Sharing.Mode == "" {
		return Exclusive
	}
	return g.Sharing.Mode
}

// MemoryPolicy and ComputePolicy are the spec's policies with the defaults filled in.
func (s *Sharing) MemoryPolicy() CapacityPolicy { return withDefaults(s.memory(), DefaultMemoryPolicy) }
func (s *Sharing) ComputePolicy() CapacityPolicy {
	return withDefaults(s.compute(), DefaultComputePolicy)
}

func (s *Sharing) memory() *CapacityPolicy {
	if s == nil {
		return nil
	}
	return s.Memory
}

func (s *Sharing) compute() *CapacityPolicy {
	if s == nil {
		return nil
	}
	return s.Compute
}

func withDefaults(p *CapacityPolicy, def CapacityPolicy) CapacityPolicy {
	out := def
	if p == nil {
		return out
	}
	if p.Min != nil {
		out.Min = p.Min
	}
	if p.Step != nil {
		out.Step = p.Step
	}
	if p.Max != nil {
		out.Max = p.Max
	}
	return out
}

// validate checks a sharing against the capacities of the GPUs it applies to (memory as merged
// from the defaults, computeTotal fixed); path names the sharing field.
func (s *Sharing) validate(path string, memory resource.Quantity, computeTotal resource.Quantity) error {
	if s == nil {
		return nil
	}
	switch s.Mode {
	case "", Exclusive, SharedMemory, Partitioned, SharedPartitions, Attachable:
	default:
		return fmt.Errorf("%s.mode: unknown mode %q; use exclusive, shared-memory, partitioned, shared-partitions or attachable", path, s.Mode)
	}
	if s.AttachDelay != nil {
		if s.Mode != Attachable {
			return fmt.Errorf("%s: attachDelay applies only to mode attachable; set it or remove attachDelay", path)
		}
		if d := s.AttachDelay.Duration; d < 0 || d > MaxAttachDelay {
			return fmt.Errorf("%s.attachDelay: %s is out of range; use 0s..%s", path, d, MaxAttachDelay)
		}
	}
	if !s.Mode.Partitions() && s.Partitions != 0 {
		return fmt.Errorf("%s: partitions applies only to modes partitioned and shared-partitions; set one of them or remove it", path)
	}
	if !s.Mode.Shares() && (s.Memory != nil || s.Compute != nil) {
		return fmt.Errorf("%s: memory and compute apply only to modes shared-memory and shared-partitions; set one of them or remove them", path)
	}
	if s.Mode.Partitions() {
		if s.Partitions == 0 {
			return fmt.Errorf("%s.partitions: required with mode %s; use 1..%d", path, s.Mode, MaxPartitions)
		}
		if s.Partitions < 1 || s.Partitions > MaxPartitions {
			return fmt.Errorf("%s.partitions: %d is out of range; use 1..%d", path, s.Partitions, MaxPartitions)
		}
	}
	if !s.Mode.Shares() {
		return nil
	}
	// Every shared device publishes the policies: the whole GPU and, partitioned, each partition.
	type device struct {
		of              string
		memory, compute resource.Quantity
	}
	devices := []device{{"the GPU's", memory, computeTotal}}
	if s.Mode == SharedPartitions {
		devices = append(devices, device{"a partition's", PartOf(memory, s.Partitions), PartOf(computeTotal, s.Partitions)})
	}
	for _, d := range devices {
		if err := checkPolicy(path+".memory", s.MemoryPolicy(), d.memory, "1Gi", d.of); err != nil {
			return err
		}
		if err := checkPolicy(path+".compute", s.ComputePolicy(), d.compute, "1", d.of); err != nil {
			return err
		}
	}
	return nil
}

// checkPolicy rejects a policy the API server would refuse (its validation of a capacity's
// requestPolicy, with the device's whole capacity as the default) or that allows no share at all;
// of names the device ("the GPU's", "a partition's").
func checkPolicy(path string, p CapacityPolicy, total resource.Quantity, example, of string) error {
	for _, f := range []struct {
		name string
		q    *resource.Quantity
	}{{"min", p.Min}, {"step", p.Step}, {"max", p.Max}} {
		if f.q != nil && f.q.Sign() <= 0 {
			return fmt.Errorf("%s.%s: %s must be positive, e.g. %s", path, f.name, f.q.String(), example)
		}
		if f.q != nil && f.q.Cmp(total) > 0 {
			return fmt.Errorf("%s.%s: %s exceeds %s %s; use at most %s", path, f.name, f.q.String(), of, total.String(), total.String())
		}
	}
	if p.Max != nil && p.Max.Cmp(*p.Min) < 0 {
		return fmt.Errorf("%s.max: %s is below min %s; raise max or lower min", path, p.Max.String(), p.Min.String())
	}
	oneStep := p.Min.DeepCopy()
	oneStep.Add(*p.Step)
	if oneStep.Cmp(total) > 0 {
		return fmt.Errorf("%s.step: min %s plus step %s exceeds %s %s; lower min or step", path, p.Min.String(), p.Step.String(), of, total.String())
	}
	// A claim that names no amount gets max (the whole GPU when unset), so it must lie on the
	// steps from min, as the API server requires.
	name, most := of, total
	if p.Max != nil {
		name, most = "max", *p.Max
	}
	if (most.MilliValue()-p.Min.MilliValue())%p.Step.MilliValue() != 0 {
		return fmt.Errorf("%s.step: %s %s is not min %s plus a multiple of step %s; choose min and step that reach it",
			path, name, most.String(), p.Min.String(), p.Step.String())
	}
	return nil
}
