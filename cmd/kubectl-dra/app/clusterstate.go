package app

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	resourcev1alpha3 "k8s.io/api/resource/v1alpha3"
	"k8s.io/apimachinery/pkg/runtime/schema"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/manifest"
	"github.com/gpu-dra/gpu-dra/internal/quantity"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// clusterState is what status and why look at, every resource.k8s.io object converted to v1.
type clusterState struct {
	inventory.Objects
	// Claims come from a --cluster-state file; Kept are the claims of a cluster, as the fleet
	// reads them.
	Claims     []*resourceapi.ResourceClaim
	Kept       []*deviceusage.Claim
	TaintRules []*resourceapi.DeviceTaintRule
	// Pods and Templates come only from a --cluster-state file; against a cluster, why reads the
	// one pod and template it is asked about.
	Pods      []*corev1.Pod
	Templates []*resourceapi.ResourceClaimTemplate
}

func (s *clusterState) fleetInput() deviceusage.Input {
	return deviceusage.Input{Slices: s.Slices, Claims: s.Claims, Kept: s.Kept, TaintRules: s.TaintRules}
}

// readClusterState decodes a --cluster-state file: ResourceSlices, DeviceClasses, ResourceClaims,
// ResourceClaimTemplates and DeviceTaintRules of any version this tool knows, Nodes and Pods, as
// documents or as the List that `kubectl get resourceslices,resourceclaims -A -o yaml` prints.
func readClusterState(data []byte) (*clusterState, error) {
	s := &clusterState{}
	for _, d := range manifest.Documents(data) {
		if d.Err != nil {
			return nil, d.Err
		}
		raw, err := sigsyaml.YAMLToJSON(d.Raw)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", d.Index, err)
		}
		if err := s.add(raw); err != nil {
			return nil, fmt.Errorf("document %d: %w", d.Index, err)
		}
	}
	return s, nil
}

func (s *clusterState) add(raw []byte) error {
	var tm struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Items      []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(raw, &tm); err != nil {
		return err
	}
	gv, err := schema.ParseGroupVersion(tm.APIVersion)
	if err != nil {
		return fmt.Errorf("apiVersion: %w", err)
	}
	gvk := gv.WithKind(tm.Kind)
	ours := gvk.Group == resourceversion.Group
	switch {
	case tm.Kind == "List":
		for i, item := range tm.Items {
			if err := s.add(item); err != nil {
				return fmt.Errorf("items[%d]: %w", i, err)
			}
		}
	case gvk == corev1.SchemeGroupVersion.WithKind("Pod"):
		p := &corev1.Pod{}
		if err := quantity.CheckJSON(raw, podQuantities); err != nil {
			return fmt.Errorf("decode Pod: %w; write a plain quantity such as 10Gi", err)
		}
		if err := sigsyaml.UnmarshalStrict(raw, p); err != nil {
			return fmt.Errorf("decode Pod: %w", err)
		}
		s.Pods = append(s.Pods, p)
	case gvk == corev1.SchemeGroupVersion.WithKind("Node"), ours && (gvk.Kind == resourceversion.KindResourceSlice || gvk.Kind == resourceversion.KindDeviceClass):
		objs, err := inventory.Read(raw)
		if err != nil {
			return err
		}
		s.Slices = append(s.Slices, objs.Slices...)
		s.Classes = append(s.Classes, objs.Classes...)
		s.Nodes = append(s.Nodes, objs.Nodes...)
	case ours && (gvk.Kind == resourceversion.KindClaim || gvk.Kind == resourceversion.KindTemplate):
		obj, err := resourceversion.Decode(raw, schema.GroupVersionKind{})
		if err != nil {
			return err
		}
		if obj.Claim != nil {
			s.Claims = append(s.Claims, obj.Claim)
		} else {
			s.Templates = append(s.Templates, obj.Template)
		}
	case ours && gvk.Kind == kindDeviceTaintRule:
		r, err := decodeTaintRule(raw, gvk.Version)
		if err != nil {
			return err
		}
		s.TaintRules = append(s.TaintRules, r)
	default:
		return fmt.Errorf("%s %s is not an object a cluster state holds (ResourceSlice, DeviceClass, ResourceClaim, ResourceClaimTemplate, DeviceTaintRule, Node, Pod)", tm.APIVersion, tm.Kind)
	}
	return nil
}

const kindDeviceTaintRule = "DeviceTaintRule"

// podQuantities are where a Pod holds quantities: its containers' and its own resources, and its
// overhead. The decoder parses each as written, at a cost only a check before it bounds.
var podQuantities = quantity.InMaps("limits", "requests", "overhead")

// decodeTaintRule reads a DeviceTaintRule of v1, v1beta2 (converted by the conversions
// k8s.io/dynamic-resource-allocation registers) or v1alpha3 (1.33–1.35), which no library converts.
func decodeTaintRule(raw []byte, version string) (*resourceapi.DeviceTaintRule, error) {
	if version == resourcev1alpha3.SchemeGroupVersion.Version {
		in := &resourcev1alpha3.DeviceTaintRule{}
		if err := sigsyaml.UnmarshalStrict(raw, in); err != nil {
			return nil, fmt.Errorf("decode DeviceTaintRule: %w", err)
		}
		return taintRuleFromV1alpha3(in), nil
	}
	obj, _, err := resourceversion.DecodeStrict(raw)
	if err != nil {
		return nil, fmt.Errorf("decode DeviceTaintRule: %w", err)
	}
	out := &resourceapi.DeviceTaintRule{}
	if err := resourceversion.Scheme().Convert(obj, out, nil); err != nil {
		return nil, fmt.Errorf("convert DeviceTaintRule to v1: %w", err)
	}
	return out, nil
}

// taintRuleFromV1alpha3 keeps what the scheduler of 1.35+ reads of a rule: which devices, which
// taint. (The alpha's class and CEL selectors are gone from the API since 1.35.)
func taintRuleFromV1alpha3(in *resourcev1alpha3.DeviceTaintRule) *resourceapi.DeviceTaintRule {
	out := &resourceapi.DeviceTaintRule{ObjectMeta: in.ObjectMeta}
	out.SetGroupVersionKind(resourceapi.SchemeGroupVersion.WithKind(kindDeviceTaintRule))
	if s := in.Spec.DeviceSelector; s != nil {
		out.Spec.DeviceSelector = &resourceapi.DeviceTaintSelector{Driver: s.Driver, Pool: s.Pool, Device: s.Device}
	}
	t := in.Spec.Taint
	out.Spec.Taint = resourceapi.DeviceTaint{Key: t.Key, Value: t.Value, Effect: resourceapi.DeviceTaintEffect(t.Effect), TimeAdded: t.TimeAdded}
	return out
}
