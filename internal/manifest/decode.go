package manifest

import (
	"encoding/json"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// convertible reports whether gvk is a kind and version this package rewrites.
func convertible(gvk schema.GroupVersionKind) bool {
	if gvk.Group != resourceversion.Group || !resourceversion.IsKnown(gvk.Version) {
		return false
	}
	switch gvk.Kind {
	case resourceversion.KindClaim, resourceversion.KindTemplate, resourceversion.KindDeviceClass:
		return true
	}
	return false
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
