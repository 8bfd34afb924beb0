package denial

import (
	"strings"
	"testing"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// TestBounds: however many findings and however long, a denial names ten, counts the rest, and
// stays within MaxBytes on a character boundary, in the one shape for every kind.
func TestBounds(t *testing.T) {
	path := field.NewPath("spec", "resourceClaims")
	var many field.ErrorList
	var manyText []string
	for i := range 25 {
		many = append(many, field.Invalid(path.Index(i), "x", "reserved"))
		manyText = append(manyText, many[i].Error())
	}
	want := `Pod "p" is invalid: spec.resourceClaims[0]: Invalid value: "x": reserved; `
	for _, msg := range []string{Fields("Pod", "p", many).Result.Message, Message("Pod", "p", manyText)} {
		if !strings.HasPrefix(msg, want) || !strings.HasSuffix(msg, `; spec.resourceClaims[9]: Invalid value: "x": reserved; and 15 more errors`) || strings.Contains(msg, "[10]") {
			t.Errorf("25 errors: %s", msg)
		}
	}
	long := field.ErrorList{field.Invalid(path.Index(0), strings.Repeat("é", 1<<20), "reserved")}
	for _, msg := range []string{Fields("ResourceClaim", "c", long).Result.Message, Message("ResourceClaim", "c", []string{long[0].Error()})} {
		if len(msg) > MaxBytes+64 || !strings.HasPrefix(msg, `ResourceClaim "c" is invalid: spec.resourceClaims[0]: Invalid value: "é`) || !strings.HasSuffix(msg, " bytes more)") || !utf8.ValidString(msg) {
			t.Errorf("a 2 MB value: %d bytes, ending %q", len(msg), msg[max(0, len(msg)-40):])
		}
	}
	twice := field.ErrorList{field.Required(path, "a"), field.Required(path, "a"), field.Required(path, "b")}
	if got, want := Fields("Pod", Name("", "web-"), twice).Result.Message, `Pod "web-*" is invalid: spec.resourceClaims: Required value: a; spec.resourceClaims: Required value: b`; got != want {
		t.Errorf("duplicates:\n got %s\nwant %s", got, want)
	}
}
