package manifest

import (
	"encoding/json"
	"fmt"

	yaml "go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/webhook/upgrade"
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

// Inventory is what a cluster publishes, as far as claim validation cares, converted to v1.
type Inventory struct {
	Slices  []*resourceapi.ResourceSlice
	Classes []*resourceapi.DeviceClass
	Nodes   []*corev1.Node
}

// list is the shape of `kubectl get -o yaml` output.
type list struct {
	Kind  string            `json:"kind"`
	Items []json.RawMessage `json:"items"`
}

// ReadInventory decodes ResourceSlices and DeviceClasses of any served resource.k8s.io version
// (and Nodes, for slices that select nodes by label) from a multi-document YAML stream or the
// List that `kubectl get resourceslices,deviceclasses -o yaml` prints. Other documents are an
// error: an inventory with a Pod in it is probably the wrong file.
func ReadInventory(data []byte) (*Inventory, error) {
	inv := &Inventory{}
	for _, d := range Documents(data) {
		if d.Err != nil {
			return nil, d.Err
		}
		if d.GVK.Kind == "List" {
			var l list
			if err := sigsyaml.Unmarshal(d.Raw, &l); err != nil {
				return nil, fmt.Errorf("document %d (List): %w", d.Index, err)
			}
			for i, item := range l.Items {
				if err := inv.add(item); err != nil {
					return nil, fmt.Errorf("document %d (List), items[%d]: %w", d.Index, i, err)
				}
			}
			continue
		}
		if err := inv.add(d.Raw); err != nil {
			return nil, fmt.Errorf("document %d: %w", d.Index, err)
		}
	}
	return inv, nil
}

func (inv *Inventory) add(raw []byte) error {
	jsonData, err := sigsyaml.YAMLToJSON(raw)
	if err != nil {
		return err
	}
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := json.Unmarshal(jsonData, &tm); err != nil {
		return err
	}
	gv, err := schema.ParseGroupVersion(tm.APIVersion)
	if err != nil {
		return fmt.Errorf("apiVersion: %w", err)
	}
	gvk := gv.WithKind(tm.Kind)
	switch {
	case gvk == corev1.SchemeGroupVersion.WithKind("Node"):
		n := &corev1.Node{}
		if err := sigsyaml.UnmarshalStrict(raw, n); err != nil {
			return fmt.Errorf("decode Node: %w", err)
		}
		inv.Nodes = append(inv.Nodes, n)
		return nil
	case gvk.Group == Group && ValidVersion(gvk.Version) && (gvk.Kind == KindResourceSlice || gvk.Kind == KindDeviceClass):
	default:
		return fmt.Errorf("%s %s is not a ResourceSlice, DeviceClass or Node; an inventory lists only those (resource.k8s.io %v)", tm.APIVersion, tm.Kind, Versions)
	}
	obj, _, err := decodeStrict(jsonData)
	if err != nil {
		return fmt.Errorf("%s %s: %w", tm.APIVersion, tm.Kind, err)
	}
	v1obj, err := upgrade.To(obj, resourceapi.SchemeGroupVersion.Version)
	if err != nil {
		return err
	}
	switch o := v1obj.(type) {
	case *resourceapi.ResourceSlice:
		inv.Slices = append(inv.Slices, o)
	case *resourceapi.DeviceClass:
		inv.Classes = append(inv.Classes, o)
	}
	return nil
}

// Filter returns the documents of data that are resource.k8s.io objects of the given kinds, as a
// new stream.
func Filter(data []byte, kinds ...string) []byte {
	var out []byte
	for _, d := range Documents(data) {
		if d.Err != nil || d.GVK.Group != Group {
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
	_, _, err := decodeStrict(doc)
	return err
}
