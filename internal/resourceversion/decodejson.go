package resourceversion

import (
	"bytes"
	"strings"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// DecodeJSON is Decode for JSON written as gvk, as an AdmissionReview carries its object. A v1
// object, which needs no conversion, is decoded in one pass with encoding/json/v2 (the module that
// mirrors it until Go 1.27) straight into the type the checks read: Decode's universal
// deserializer scans the object three times and conversion copies it once more, which is most of
// what an admission review allocates. Whatever v2's stricter defaults refuse (duplicate names,
// invalid UTF-8), other versions, objects whose apiVersion or kind is spelt in another case, and objects that name another apiVersion or kind, go through
// Decode, so the answer and its errors are Decode's.
func DecodeJSON(raw []byte, gvk schema.GroupVersionKind) (*Object, error) {
	if gvk.Group != Group || gvk.Version != resourceapi.SchemeGroupVersion.Version || (gvk.Kind != KindClaim && gvk.Kind != KindTemplate) {
		return Decode(raw, gvk)
	}
	if err := checkQuantities(raw); err != nil || typeMetaFolded(raw) {
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

// scanners keep typeMetaFolded's decoders: a new one costs a review a dozen allocations.
var scanners = sync.Pool{New: func() any {
	s := &scanner{}
	s.dec = jsontext.NewDecoder(&s.empty)
	return s
}}

type scanner struct {
	dec   *jsontext.Decoder
	empty bytes.Buffer
}

// release returns s to the pool without the review's body, which must not outlive the review.
func (s *scanner) release() {
	s.dec.Reset(&s.empty)
	scanners.Put(s)
}

// typeMetaFolded reports whether a top-level member of raw names apiVersion or kind in another
// case ("APIVersion", "\u212Aind"): Decode reads the type with encoding/json, which matches names
// case-insensitively, while v2 matches them exactly and would take the object for the version the
// review says. Only such an object pays for Decode; a document v2 cannot read goes there anyway.
func typeMetaFolded(raw []byte) bool {
	s := scanners.Get().(*scanner)
	defer s.release()
	// On a *bytes.Buffer the decoder reads raw in place instead of copying it into its own buffer.
	s.dec.Reset(bytes.NewBuffer(raw), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	dec := s.dec
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return false
	}
	for dec.PeekKind() == '"' {
		tok, err := dec.ReadToken()
		if err != nil {
			return false
		}
		name := tok.String()
		if name != "apiVersion" && strings.EqualFold(name, "apiVersion") || name != "kind" && strings.EqualFold(name, "kind") {
			return true
		}
		if err := dec.SkipValue(); err != nil {
			return false
		}
	}
	return false
}
