package quantity

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"

	"github.com/go-json-experiment/json/jsontext"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// CheckJSON finds, before a decoder hands them to resource.ParseQuantity, the quantities of a
// JSON document whose parsing cost is unbounded. Every string and number value is read as
// resource.Quantity's UnmarshalJSON reads it; only for a Costly one does field get its JSON
// pointer, and return where the value sits, or "" where no quantity does (a label may hold any
// text). The error names that place, the value and the reason. A document that is not JSON is
// left to the decoder to refuse.
func CheckJSON(doc []byte, field func(jsontext.Pointer) string) error {
	dec := jsontext.NewDecoder(bytes.NewBuffer(doc), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	for {
		kind := dec.PeekKind()
		if kind == 0 {
			return nil
		}
		if kind != '"' && kind != '0' || isName(dec) {
			if _, err := dec.ReadToken(); err != nil {
				return nil
			}
			continue
		}
		v, err := dec.ReadValue()
		if err != nil {
			return nil
		}
		// resource.Quantity's UnmarshalJSON parses the bytes between the quotes as they are,
		// escapes included (a value with one fails at once), blanks trimmed.
		s := v
		if kind == '"' {
			s = v[1 : len(v)-1]
		}
		s = bytes.TrimSpace(s)
		if !costly(s) {
			continue
		}
		if at := field(dec.StackPointer()); at != "" {
			return fmt.Errorf("%s: %q: %w", at, shorten(string(s)), check(s))
		}
	}
}

// InMaps is a field function for CheckJSON: values in a map named one of maps (such as a
// container's "limits" or a node's "capacity"), anywhere outside metadata, are quantities.
func InMaps(maps ...string) func(jsontext.Pointer) string {
	isMap := func(t string) bool { return slices.Contains(maps, t) }
	return func(p jsontext.Pointer) string {
		if !isMap(p.Parent().LastToken()) {
			return ""
		}
		for t := range p.Tokens() {
			if t == "metadata" {
				return ""
			}
		}
		return FieldPath(p, func(parent, _ string) bool { return isMap(parent) }).String()
	}
}

// FieldPath renders p as a field path: tokens that isKey (nil: none) says are keys of a map as
// [key], array indexes as [i], names as .name.
func FieldPath(p jsontext.Pointer, isKey func(parent, token string) bool) *field.Path {
	var path *field.Path
	parent := ""
	for t := range p.Tokens() {
		switch {
		case path == nil:
			path = field.NewPath(t)
		case isKey != nil && isKey(parent, t):
			path = path.Key(t)
		case isIndex(t):
			n, _ := strconv.Atoi(t)
			path = path.Index(n)
		default:
			path = path.Child(t)
		}
		parent = t
	}
	return path
}

func isIndex(t string) bool {
	_, err := strconv.Atoi(t)
	return err == nil && t[0] != '-' && t[0] != '+'
}

// isName: the next token of dec is an object member's name, not a value.
func isName(dec *jsontext.Decoder) bool {
	kind, n := dec.StackIndex(dec.StackDepth())
	return kind == '{' && n%2 == 0
}

// shorten keeps a message readable when the value is a megabyte of digits.
func shorten(s string) string {
	if len(s) <= MaxLength {
		return s
	}
	return s[:MaxLength] + "..."
}
