// Package denial words the webhook's refusals of invalid objects, pods, claims and templates
// alike, in the API server's own shape: `<Kind> "<name>" is invalid: <finding>; <finding>`. The
// message is bounded, both for the person reading it and against the cost of a forged review,
// which can carry thousands of bad fields, each quoting a value of any length.
package denial

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

const (
	// MaxFindings bounds the findings a denial names; the rest are counted.
	MaxFindings = 10
	// MaxBytes bounds a denial's message; past it the message is cut and the rest counted.
	MaxBytes = 4 << 10
)

// Invalid denies the object kind name (see Name) for findings, each a "<field>: <what is wrong
// and the fix>" or a sentence about the object as a whole.
func Invalid(kind, name string, findings []string) admission.Response {
	return admission.Denied(Message(kind, name, findings))
}

// Fields denies the object kind name for field errors; identical errors count once, and only
// those shown are formatted.
func Fields(kind, name string, errs field.ErrorList) admission.Response {
	first := errs[:min(len(errs), MaxFindings)]
	var findings []string
	if agg := first.ToAggregate(); agg != nil {
		for _, e := range agg.Errors() {
			findings = append(findings, e.Error())
		}
	}
	return admission.Denied(message(kind, name, findings, len(errs)-len(first)))
}

// Message is the denial's text: at most MaxFindings findings, a count of the rest, and the whole
// cut at MaxBytes on a character boundary.
func Message(kind, name string, findings []string) string {
	shown := findings[:min(len(findings), MaxFindings)]
	return message(kind, name, shown, len(findings)-len(shown))
}

// message words shown findings and counts more, cut at MaxBytes.
func message(kind, name string, shown []string, more int) string {
	if more > 0 {
		shown = append(shown[:len(shown):len(shown)], fmt.Sprintf("and %d more errors", more))
	}
	msg := fmt.Sprintf("%s %q is invalid: %s", kind, name, strings.Join(shown, "; "))
	if len(msg) > MaxBytes {
		cut := MaxBytes
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = fmt.Sprintf("%s... (%d bytes more)", msg[:cut], len(msg)-cut)
	}
	return msg
}

// Name is how a denial names an object: its name, or for one the API server has yet to name
// (generateName, as for claims made from templates and pods made by controllers) the prefix
// followed by "*".
func Name(name, generateName string) string {
	if name == "" {
		return generateName + "*"
	}
	return name
}
