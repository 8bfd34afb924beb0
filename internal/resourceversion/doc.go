// Package resourceversion is the one home of what this project knows about the resource.k8s.io
// API as such: its group and kinds, the versions k8s.io/dynamic-resource-allocation converts
// between, which of them a cluster serves, and decoding a claim or template of any version into
// v1 (and converting it back to any other).
//
// The plugin, the webhook, kubectl dra and the tests all import it, so a 1.32 cluster (v1beta1
// only) and a 1.36 one (v1 only) are told apart, and an old object is upgraded, the same way
// everywhere. Rewriting YAML manifests while keeping their comments is a different job: see
// internal/manifest.
package resourceversion

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
)

// Group is the API group of DRA's objects.
const Group = resourceapi.GroupName

// Kinds of the group this project reads or writes.
const (
	KindClaim         = "ResourceClaim"
	KindTemplate      = "ResourceClaimTemplate"
	KindDeviceClass   = "DeviceClass"
	KindResourceSlice = "ResourceSlice"
)

// The versions of the group this project knows, by name.
var (
	V1      = resourceapi.SchemeGroupVersion.Version
	V1beta2 = resourcev1beta2.SchemeGroupVersion.Version
	V1beta1 = resourcev1beta1.SchemeGroupVersion.Version
)

// Known are the versions k8s.io/dynamic-resource-allocation/client converts to and from, newest
// first.
var Known = []string{V1, V1beta2, V1beta1}

// IsKnown reports whether v is one of Known.
func IsKnown(v string) bool { return slices.Contains(Known, v) }
