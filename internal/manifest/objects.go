package manifest

import (
	"fmt"

	yaml "go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// Document is one non-empty document of a YAML stream.
type Document struct {
	// Index is the 1-based position in the stream.
	Index     int
	GVK       schema.GroupVersionKind
	Namespace string
	Name      string
	// Raw is the document as written.
	Raw []byte
	// Err is set when the document is not YAML.
	Err error
}

// Documents lists the non-empty documents of a stream with their apiVersion, kind and name.
func Documents(data []byte) []Document {
	var out []Document
	for i, c := range split(data) {
		if isEmpty(c.body) {
			continue
		}
		d := Document{Index: i + 1, Raw: c.body}
		var n yaml.Node
		if err := yaml.Unmarshal(c.body, &n); err != nil {
			d.Err = fmt.Errorf("document %d is not valid YAML: %w", d.Index, err)
		} else if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
			h := readHeader(n.Content[0])
			d.GVK, d.Namespace, d.Name = h.gvk, h.namespace, h.name
		}
		out = append(out, d)
	}
	return out
}

// Filter returns the documents of data that are resource.k8s.io objects of the given kinds, as a
// new stream.
func Filter(data []byte, kinds ...string) []byte {
	var out []byte
	for _, d := range Documents(data) {
		if d.Err != nil || d.GVK.Group != resourceversion.Group {
			continue
		}
		for _, k := range kinds {
			if d.GVK.Kind == k {
				out = append(out, "---\n"...)
				out = append(out, d.Raw...)
				if len(d.Raw) > 0 && d.Raw[len(d.Raw)-1] != '\n' {
					out = append(out, '\n')
				}
			}
		}
	}
	return out
}

// CheckStrict decodes one document (YAML or JSON) the way the API server does with strict field
// validation, which `kubectl apply` uses by default: unknown and duplicate fields are errors.
func CheckStrict(doc []byte) error {
	_, _, err := resourceversion.DecodeStrict(doc)
	return err
}
