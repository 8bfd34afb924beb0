package inventory

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/manifest"
	"github.com/gpu-dra/gpu-dra/internal/quantity"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// list is the shape of `kubectl get -o yaml` output.
type listDoc struct {
	Kind  string            `json:"kind"`
	Items []json.RawMessage `json:"items"`
}

// Read decodes ResourceSlices and DeviceClasses of any served resource.k8s.io version
// (and Nodes, for slices that select nodes by label) from a multi-document YAML stream or the
// List that `kubectl get resourceslices,deviceclasses -o yaml` prints. Other documents are an
// error: a file with a Pod in it is probably the wrong file.
func Read(data []byte) (*Objects, error) {
	inv := &Objects{}
	for _, d := range manifest.Documents(data) {
		if d.Err != nil {
			return nil, d.Err
		}
		if d.GVK.Kind == "List" {
			var l listDoc
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

func (inv *Objects) add(raw []byte) error {
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
		// The decoder parses each capacity as written, at a cost only a check before it bounds.
		if err := quantity.CheckJSON(jsonData, quantity.InMaps("capacity", "allocatable")); err != nil {
			return fmt.Errorf("decode Node: %w; write a plain quantity such as 64Gi", err)
		}
		if err := sigsyaml.UnmarshalStrict(raw, n); err != nil {
			return fmt.Errorf("decode Node: %w", err)
		}
		inv.Nodes = append(inv.Nodes, n)
		return nil
	case gvk.Group == resourceversion.Group && resourceversion.IsKnown(gvk.Version) && (gvk.Kind == resourceversion.KindResourceSlice || gvk.Kind == resourceversion.KindDeviceClass):
	default:
		return fmt.Errorf("%s %s is not a ResourceSlice, DeviceClass or Node; an inventory lists only those (resource.k8s.io %v)", tm.APIVersion, tm.Kind, resourceversion.Known)
	}
	obj, _, err := resourceversion.DecodeStrict(jsonData)
	if err != nil {
		return fmt.Errorf("%s %s: %w", tm.APIVersion, tm.Kind, err)
	}
	v1obj, err := resourceversion.To(obj, resourceapi.SchemeGroupVersion.Version)
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
