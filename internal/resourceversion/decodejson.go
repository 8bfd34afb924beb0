package resourceversion

import (
	jsonv2 "github.com/go-json-experiment/json"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// DecodeJSON is Decode for JSON written as gvk, as an AdmissionReview carries its object. A v1
// object, which needs no conversion, is decoded in one pass with encoding/json/v2 (the module that
// mirrors it until Go 1.27) straight into the type the checks read: Decode's universal
// deserializer scans the object three times and conversion copies it once more, which is most of
// what an admission review allocates. Whatever v2's stricter defaults refuse (duplicate names,
// invalid UTF-8), other versions, and objects that name another apiVersion or kind, go through
// Decode, so the answer and its errors are Decode's.
func DecodeJSON(raw []byte, gvk schema.GroupVersionKind) (*Object, error) {
	if gvk.Group != Group || gvk.Version != resourceapi.SchemeGroupVersion.Version || (gvk.Kind != KindClaim && gvk.Kind != KindTemplate) {
		return Decode(raw, gvk)
	}
	if err := checkQuantities(raw); err != nil {
		return Decode(raw, gvk)
	}
	out := &Object{Arrived: gvk}
	var err error
	if gvk.Kind == KindTemplate {
		out.Template = &resourceapi.ResourceClaimTemplate{}
		err = jsonv2.Unmarshal(raw, out.Template)
	} else {
		out.Claim = &resourceapi.ResourceClaim{}
		err = jsonv2.Unmarshal(raw, out.Claim)
	}
	if err != nil {
		return Decode(raw, gvk)
	}
	kind := out.objectKind()
	if got := kind.GroupVersionKind(); (got.Version != "" || got.Group != "") && got != gvk || got.Kind != "" && got.Kind != gvk.Kind {
		return Decode(raw, gvk)
	}
	kind.SetGroupVersionKind(gvk)
	Default(out.Spec())
	return out, nil
}

func (o *Object) objectKind() schema.ObjectKind {
	if o.Template != nil {
		return o.Template.GetObjectKind()
	}
	return o.Claim.GetObjectKind()
}
