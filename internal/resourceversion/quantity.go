package resourceversion

import (
	"bytes"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/quantity"
)

// checkQuantities refuses a document one of whose quantities resource.ParseQuantity, which the
// decoder calls on each as written, would parse for seconds or minutes ("1e-5000000" in a claim's
// capacity request: 10 bytes, a second). YAML is read as JSON, as the decoder reads it; the
// decoder still gets doc itself, so that its strict mode sees YAML's duplicate keys.
func checkQuantities(doc []byte) error {
	if t := bytes.TrimSpace(doc); len(t) == 0 || t[0] != '{' {
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil // the decoder says what is wrong
		}
		doc = j
	}
	return quantity.CheckJSON(doc, quantityField)
}

// quantityField is the field path of the value at p when it is one of the resource.k8s.io
// quantities (a capacity, capacity request, consumed capacity, counter or request policy), and ""
// elsewhere (metadata and a driver's opaque parameters hold text of any shape).
func quantityField(p jsontext.Pointer) string {
	quantities := false
	for t := range p.Tokens() {
		switch strings.ToLower(t) {
		case "metadata", "parameters":
			return ""
		case "capacity", "consumedcapacity", "counters", "requestpolicy":
			quantities = true
		}
	}
	if !quantities {
		return ""
	}
	return quantity.FieldPath(p, keyed).String()
}

// keyed: t is a key of a map of quantities, such as a capacity's name.
func keyed(parent, t string) bool {
	switch strings.ToLower(parent) {
	case "capacity":
		return !strings.EqualFold(t, "requests")
	case "requests", "consumedcapacity", "counters":
		return true
	}
	return false
}
