package manifest

import (
	"encoding/json"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/servedversion"
	"github.com/gpu-dra/gpu-dra/webhook/upgrade"
)

// Group is the API group whose objects are converted.
const Group = resourceapi.GroupName

// Versions lists the resource.k8s.io versions this package converts between, newest first: the
// ones the cluster-side code talks in.
var Versions = servedversion.Known

// Kinds that are converted; every other document passes through untouched.
const (
	KindClaim         = "ResourceClaim"
	KindTemplate      = "ResourceClaimTemplate"
	KindDeviceClass   = "DeviceClass"
	KindResourceSlice = "ResourceSlice"
)

var (
	// The webhook's scheme: the API types plus the conversions k8s.io/dynamic-resource-allocation
	// maintains (e.g. request fields moving under `exactly`), so both convert alike.
	scheme = upgrade.Scheme()
	// strict rejects unknown and duplicate fields, as `kubectl apply` does with server-side
	// field validation: an upgrade must not silently drop a misspelt field.
	strict = serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
)

// ValidVersion reports whether v is a resource.k8s.io version this package converts to.
func ValidVersion(v string) bool {
	for _, known := range Versions {
		if v == known {
			return true
		}
	}
	return false
}

// convertible reports whether gvk is a kind and version this package rewrites.
func convertible(gvk schema.GroupVersionKind) bool {
	if gvk.Group != Group || !ValidVersion(gvk.Version) {
		return false
	}
	switch gvk.Kind {
	case KindClaim, KindTemplate, KindDeviceClass:
		return true
	}
	return false
}

// decodeStrict reads one YAML or JSON document as the typed object its apiVersion and kind name.
func decodeStrict(doc []byte) (runtime.Object, schema.GroupVersionKind, error) {
	obj, gvk, err := strict.Decode(doc, nil, nil)
	if err != nil {
		var empty schema.GroupVersionKind
		if gvk != nil {
			empty = *gvk
		}
		return nil, empty, err
	}
	return obj, *gvk, nil
}

// render writes a typed object as YAML without the empty fields Go's zero values would add
// (creationTimestamp: null, status: {}), for documents the node rewrite cannot reproduce.
func render(obj runtime.Object) ([]byte, error) {
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	if meta, ok := m["metadata"].(map[string]any); ok {
		if meta["creationTimestamp"] == nil {
			delete(meta, "creationTimestamp")
		}
	}
	if st, ok := m["status"].(map[string]any); ok && len(st) == 0 {
		delete(m, "status")
	}
	if spec, ok := m["spec"].(map[string]any); ok {
		// A template's claim metadata.
		if md, ok := spec["metadata"].(map[string]any); ok && len(md) == 0 {
			delete(spec, "metadata")
		}
	}
	return yaml.Marshal(m)
}
