// Package health is where a device's faults come from and what they mean: the Source interface a
// hardware backend would implement, the simulated source (faults injected into a ConfigMap the chart
// owns, one entry per node, written by `kubectl dra fault`), the entry format both sides share,
// and the taint a fault becomes. Publishing the taints, streaming health to the kubelet and telling
// the pods are the plugin's (driver/plugin).
package faults

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Kind is what went wrong with a device.
type Kind string

const (
	// KindXID: the GPU reported an XID error (a driver-detected fault: ECC, a fallen channel...).
	KindXID Kind = "xid"
	// KindFallenOff: the GPU fell off the bus; the node no longer sees it.
	KindFallenOff Kind = "fallen-off"
	// KindAttachFailure: attaching the device to the node fails (attachable node groups). The
	// device itself stays healthy: no taint, nothing reported to the kubelet, so the scheduler
	// keeps offering it and each attach of it fails until the fault is cleared.
	KindAttachFailure Kind = "attach-failure"
)

// Kinds lists every kind, in the order help texts and the chart's schema show them.
var Kinds = []Kind{KindXID, KindFallenOff, KindAttachFailure}

// Unhealthy reports whether a fault of the kind makes its device unhealthy: tainted, and reported
// so to the kubelet and to the pods using it.
func (k Kind) Unhealthy() bool { return k != KindAttachFailure }

// UnhealthyKindNames returns the names of the Kinds that make devices unhealthy (and taint them).
func UnhealthyKindNames() []string {
	var out []string
	for _, k := range Kinds {
		if k.Unhealthy() {
			out = append(out, string(k))
		}
	}
	return out
}

// Unhealthy is the faults that make their devices unhealthy (see Kind.Unhealthy).
func (f Faults) Unhealthy() Faults {
	out := make(Faults, len(f))
	for dev, fault := range f {
		if fault.Kind.Unhealthy() {
			out[dev] = fault
		}
	}
	return out
}

// KindNames returns the names of Kinds.
func KindNames() []string {
	out := make([]string, 0, len(Kinds))
	for _, k := range Kinds {
		out = append(out, string(k))
	}
	return out
}

// ParseKind checks a kind's name.
func ParseKind(s string) (Kind, error) {
	if slices.Contains(Kinds, Kind(s)) {
		return Kind(s), nil
	}
	return "", fmt.Errorf("unknown fault kind %q; known kinds: %s", s, strings.Join(KindNames(), ", "))
}

// Fault is one device's fault: what, since when, and the detail a person needs.
type Fault struct {
	Kind    Kind        `json:"kind"`
	Time    metav1.Time `json:"time"`
	Message string      `json:"message,omitempty"`
}

// Faults are a node's faulty devices, by device name. A device without an entry is healthy.
type Faults map[string]Fault

// Equal compares by kind, time (to the second, as it is stored) and message.
func (f Faults) Equal(o Faults) bool {
	return maps.EqualFunc(f, o, func(a, b Fault) bool {
		return a.Kind == b.Kind && a.Message == b.Message && a.Time.Unix() == b.Time.Unix()
	})
}

// Bounds of an entry: what one node's plugin reads is limited whatever a writer put there (the
// API server limits the whole ConfigMap to 1 MiB).
const (
	// MaxFaultsPerNode is more than any node has devices (a partitioned node group publishes at
	// most 16 partitions and the whole GPU per GPU).
	MaxFaultsPerNode = 1024
	// MaxMessageLength is in bytes.
	MaxMessageLength = 1024
	// MaxEntryBytes bounds one node's entry before it is decoded.
	MaxEntryBytes = 256 << 10
)

// Known tells whether a device exists on the node; nil accepts every valid name.
type Known func(device string) bool

// ParseEntry decodes and checks one node's entry of the faults ConfigMap (key: the node name).
// Errors name the key and the device, and say what to fix; one bad device rejects the entry, so
// that the caller can keep what it had.
func ParseEntry(key, value string, known Known) (Faults, error) {
	if len(value) > MaxEntryBytes {
		return nil, fmt.Errorf("entry %q: %d bytes, more than %d; clear faults with `kubectl dra fault clear`", key, len(value), MaxEntryBytes)
	}
	faults := Faults{}
	if strings.TrimSpace(value) == "" {
		return faults, nil
	}
	if err := yaml.UnmarshalStrict([]byte(value), &faults); err != nil {
		return nil, fmt.Errorf("entry %q is not a map of device name to {kind, time, message}: %w", key, err)
	}
	if err := faults.Validate(key, known); err != nil {
		return nil, err
	}
	return faults, nil
}

// Validate checks every fault of one node's entry.
func (f Faults) Validate(key string, known Known) error {
	if len(f) > MaxFaultsPerNode {
		return fmt.Errorf("entry %q: %d faults, more than %d", key, len(f), MaxFaultsPerNode)
	}
	var errs []error
	for _, dev := range slices.Sorted(maps.Keys(f)) {
		fault := f[dev]
		at := fmt.Sprintf("entry %q, device %q", key, dev)
		switch {
		case len(validation.IsDNS1123Label(dev)) > 0:
			errs = append(errs, fmt.Errorf("%s: not a device name (a DNS label such as gpu-0)", at))
		case known != nil && !known(dev):
			errs = append(errs, fmt.Errorf("%s: no such device on this node; name one the node's ResourceSlice publishes", at))
		}
		if _, err := ParseKind(string(fault.Kind)); err != nil {
			errs = append(errs, fmt.Errorf("%s: kind: %w", at, err))
		}
		if fault.Time.IsZero() {
			errs = append(errs, fmt.Errorf("%s: time is missing; give it as RFC 3339 (2026-12-03T10:00:00Z)", at))
		}
		if len(fault.Message) > MaxMessageLength || !utf8.ValidString(fault.Message) {
			errs = append(errs, fmt.Errorf("%s: message must be UTF-8 of at most %d bytes", at, MaxMessageLength))
		}
		if len(errs) >= 10 {
			errs = append(errs, errors.New("more errors not shown"))
			break
		}
	}
	return errors.Join(errs...)
}

// Encode is the entry's value, as ParseEntry reads it; "" for no faults.
func (f Faults) Encode() (string, error) {
	if len(f) == 0 {
		return "", nil
	}
	data, err := yaml.Marshal(f)
	if err != nil {
		return "", fmt.Errorf("encode faults: %w", err)
	}
	return string(data), nil
}
