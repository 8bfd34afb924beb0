package resourceversion

// Claims and templates of any served version are decoded and converted to v1 with the conversions
// k8s.io/dynamic-resource-allocation registers, so that every check is written once, against v1.

import (
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	drav1beta1 "k8s.io/dynamic-resource-allocation/api/v1beta1"
	drav1beta2 "k8s.io/dynamic-resource-allocation/api/v1beta2"
	"sigs.k8s.io/yaml"
)

var (
	scheme = runtime.NewScheme()
	codecs serializer.CodecFactory
	// strict rejects unknown and duplicate fields, as `kubectl apply` does with server-side
	// field validation: an upgrade must not silently drop a misspelt field.
	strict runtime.Decoder
)

func init() {
	// The v1beta1/v1beta2 AddToScheme of dynamic-resource-allocation register the API types together
	// with the hand-written conversions to v1 (e.g. selectors moving under `exactly`).
	utilruntime.Must(resourceapi.AddToScheme(scheme))
	utilruntime.Must(drav1beta1.AddToScheme(scheme))
	utilruntime.Must(drav1beta2.AddToScheme(scheme))
	codecs = serializer.NewCodecFactory(scheme)
	strict = serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}

// DecodeStrict reads one YAML or JSON document of any Known version as the typed object its
// apiVersion and kind name, the way the API server does with strict field validation: unknown
// and duplicate fields are errors. The object is not converted.
func DecodeStrict(doc []byte) (runtime.Object, schema.GroupVersionKind, error) {
	if err := checkQuantities(doc); err != nil {
		return nil, schema.GroupVersionKind{}, err
	}
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

// Scheme knows every resource.k8s.io version and the conversions between them; the manifest
// rewriter converts DeviceClasses and ResourceSlices with it too. Callers must not add to it.
func Scheme() *runtime.Scheme { return scheme }

// Object is a claim or a template after conversion to v1, with the version it arrived in.
type Object struct {
	// Arrived is the group/version/kind the object was written in.
	Arrived schema.GroupVersionKind
	// Exactly one of Claim and Template is set.
	Claim    *resourceapi.ResourceClaim
	Template *resourceapi.ResourceClaimTemplate
}

// Spec returns the claim spec (of the claim or inside the template).
func (o *Object) Spec() *resourceapi.ResourceClaimSpec {
	if o.Template != nil {
		return &o.Template.Spec.Spec
	}
	return &o.Claim.Spec
}

// SpecPath is where Spec lives in the object: spec for a claim, spec.spec for a template.
func (o *Object) SpecPath() *field.Path {
	if o.Template != nil {
		return field.NewPath("spec", "spec")
	}
	return field.NewPath("spec")
}

// Name of the object.
func (o *Object) Name() string {
	if o.Template != nil {
		return o.Template.Name
	}
	return o.Claim.Name
}

// GenerateName is the name prefix of an object the server will name.
func (o *Object) GenerateName() string {
	if o.Template != nil {
		return o.Template.GenerateName
	}
	return o.Claim.GenerateName
}

// Namespace of the object.
func (o *Object) Namespace() string {
	if o.Template != nil {
		return o.Template.Namespace
	}
	return o.Claim.Namespace
}

// Deprecated reports whether the object arrived in a beta version, which Kubernetes 1.38 removes.
func (o *Object) Deprecated() bool {
	return o.Arrived.Version != resourceapi.SchemeGroupVersion.Version
}

// IsV1Beta1 reports whether field paths must be written in the v1beta1 layout, where a request's
// deviceClassName, selectors and count sit on the request itself instead of under `exactly`.
func (o *Object) IsV1Beta1() bool {
	return o.Arrived.Version == resourcev1beta1.SchemeGroupVersion.Version
}

// Supported reports whether gvk is a claim or template of a resource.k8s.io version this package reads.
func Supported(gvk schema.GroupVersionKind) bool {
	if gvk.Group != Group || (gvk.Kind != KindClaim && gvk.Kind != KindTemplate) {
		return false
	}
	return IsKnown(gvk.Version)
}

// Decode reads raw (JSON or YAML) written as gvk, or as the apiVersion/kind inside raw when gvk is
// empty, and converts it to v1. The API server's defaults are applied (see Default), so offline
// input and admitted objects are judged alike.
func Decode(raw []byte, gvk schema.GroupVersionKind) (*Object, error) {
	var defaults *schema.GroupVersionKind
	if !gvk.Empty() {
		defaults = &gvk
	} else {
		// Name what the input is before the scheme complains that it does not know it.
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(raw, &tm); err == nil && tm.Kind != "" {
			if got := schema.FromAPIVersionAndKind(tm.APIVersion, tm.Kind); !Supported(got) {
				return nil, fmt.Errorf("decode: %s is not a ResourceClaim or ResourceClaimTemplate of resource.k8s.io v1beta1, v1beta2 or v1", describe(got))
			}
		}
	}
	if err := checkQuantities(raw); err != nil {
		return nil, fmt.Errorf("decode %s: %w", describe(gvk), err)
	}
	obj, got, err := codecs.UniversalDeserializer().Decode(raw, defaults, nil)
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", describe(gvk), err)
	}
	if !Supported(*got) {
		return nil, fmt.Errorf("decode: %s is not a ResourceClaim or ResourceClaimTemplate of resource.k8s.io v1beta1, v1beta2 or v1", describe(*got))
	}
	return Convert(obj, *got)
}

// Convert turns a typed claim or template of any supported version into v1.
func Convert(obj runtime.Object, arrived schema.GroupVersionKind) (*Object, error) {
	out := &Object{Arrived: arrived}
	var target runtime.Object
	if arrived.Kind == KindTemplate {
		out.Template = &resourceapi.ResourceClaimTemplate{}
		target = out.Template
	} else {
		out.Claim = &resourceapi.ResourceClaim{}
		target = out.Claim
	}
	if err := scheme.Convert(obj, target, nil); err != nil {
		return nil, fmt.Errorf("convert %s to resource.k8s.io/v1: %w", describe(arrived), err)
	}
	target.GetObjectKind().SetGroupVersionKind(resourceapi.SchemeGroupVersion.WithKind(arrived.Kind))
	Default(out.Spec())
	return out, nil
}

// Default applies the API server's defaults for device requests: allocationMode ExactCount and
// count 1. The allocator rejects an empty mode ("unsupported count mode"), so offline input must be
// defaulted exactly as the server would.
func Default(spec *resourceapi.ResourceClaimSpec) {
	for i := range spec.Devices.Requests {
		r := &spec.Devices.Requests[i]
		if r.Exactly != nil {
			defaultMode(&r.Exactly.AllocationMode, &r.Exactly.Count)
		}
		for j := range r.FirstAvailable {
			defaultMode(&r.FirstAvailable[j].AllocationMode, &r.FirstAvailable[j].Count)
		}
	}
}

func defaultMode(mode *resourceapi.DeviceAllocationMode, count *int64) {
	if *mode == "" {
		*mode = resourceapi.DeviceAllocationModeExactCount
	}
	if *mode == resourceapi.DeviceAllocationModeExactCount && *count == 0 {
		*count = 1
	}
}

// V1Form is the compact JSON of the object's spec in resource.k8s.io/v1: what the user should
// write instead of a deprecated version.
func (o *Object) V1Form() string {
	var spec any
	if o.Template != nil {
		t := map[string]any{"spec": o.Template.Spec.Spec}
		// An empty metadata block is noise in a one-line warning.
		meta := map[string]any{}
		if m := o.Template.Spec.ObjectMeta; len(m.Labels) > 0 {
			meta["labels"] = m.Labels
		}
		if m := o.Template.Spec.ObjectMeta; len(m.Annotations) > 0 {
			meta["annotations"] = m.Annotations
		}
		if len(meta) > 0 {
			t["metadata"] = meta
		}
		spec = t
	} else {
		spec = o.Claim.Spec
	}
	data, err := json.Marshal(map[string]any{"apiVersion": resourceapi.SchemeGroupVersion.String(), "kind": o.Arrived.Kind, "spec": spec})
	if err != nil {
		// Marshalling a typed API object cannot fail; keep the warning useful anyway.
		return fmt.Sprintf("(cannot render: %v)", err)
	}
	return string(data)
}

func describe(gvk schema.GroupVersionKind) string {
	if gvk.Empty() {
		return "object"
	}
	return gvk.GroupVersion().String() + " " + gvk.Kind
}

// To converts the object to the named resource.k8s.io version, as the API server would serve it.
func (o *Object) To(version string) (runtime.Object, error) {
	if o.Template != nil {
		return To(o.Template, version)
	}
	return To(o.Claim, version)
}

// To converts a claim or template of any served resource.k8s.io version to the named one
// (v1beta1, v1beta2 or v1), through v1: the conversions are registered between each beta and v1.
func To(in runtime.Object, version string) (runtime.Object, error) {
	kinds, _, err := scheme.ObjectKinds(in)
	if err != nil {
		return nil, fmt.Errorf("convert to %s: %w", version, err)
	}
	from := kinds[0]
	hub := resourceapi.SchemeGroupVersion.WithKind(from.Kind)
	if from != hub {
		if in, err = convert(in, from, hub); err != nil {
			return nil, err
		}
	}
	target := schema.GroupVersionKind{Group: Group, Version: version, Kind: from.Kind}
	if target == hub {
		out := in.DeepCopyObject()
		out.GetObjectKind().SetGroupVersionKind(target)
		return out, nil
	}
	return convert(in, hub, target)
}

func convert(in runtime.Object, from, to schema.GroupVersionKind) (runtime.Object, error) {
	out, err := scheme.New(to)
	if err != nil {
		return nil, fmt.Errorf("convert %s to %s: %w", from, to, err)
	}
	if err := scheme.Convert(in, out, nil); err != nil {
		return nil, fmt.Errorf("convert %s to %s: %w", from, to, err)
	}
	out.GetObjectKind().SetGroupVersionKind(to)
	return out, nil
}
