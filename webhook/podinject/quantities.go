package podinject

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
	corev1 "k8s.io/api/core/v1"
)

// extendedQuantities are the entries of a container's resources.limits or .requests whose name
// has a domain (a "/"): the only ones the handler reads. cpu, memory and the like are skipped
// without being decoded, so a pod that asks for GPUs by annotation costs what it did before limits
// were read at all.
type extendedQuantities []quantityEntry

type quantityEntry struct {
	name corev1.ResourceName
	// value is the quantity as written: a JSON string's content or a JSON number's text.
	value string
	// quantity is false for any other JSON value (the API server would not decode the pod).
	quantity bool
}

// UnmarshalJSONFrom reads the value in the one-pass decode (encoding/json/v2), which has already
// checked it; both decoders end in UnmarshalJSON, so the two servings cannot disagree.
func (q *extendedQuantities) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	v, err := dec.ReadValue()
	if err != nil {
		return err
	}
	return q.UnmarshalJSON(v)
}

// UnmarshalJSON keeps the entries with a domain. A value that is not an object, as the API server
// never sends, yields none: the pod is judged as if the field were absent.
func (q *extendedQuantities) UnmarshalJSON(b []byte) error {
	*q = nil
	// Names with a domain contain "/" (or its escape "\/"); most pods have none.
	if !bytes.ContainsAny(b, `/\`) {
		return nil
	}
	var entries map[string]json.RawMessage
	if err := json.Unmarshal(b, &entries); err != nil {
		return nil
	}
	for name, raw := range entries {
		if !strings.Contains(name, "/") {
			continue
		}
		e := quantityEntry{name: corev1.ResourceName(name)}
		switch {
		case len(raw) > 0 && raw[0] == '"':
			e.quantity = json.Unmarshal(raw, &e.value) == nil
		case len(raw) > 0 && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9'):
			e.value, e.quantity = string(raw), true
		default:
			e.value = string(raw)
		}
		*q = append(*q, e)
	}
	slices.SortFunc(*q, func(a, b quantityEntry) int { return strings.Compare(string(a.name), string(b.name)) })
	return nil
}

// get returns the entry for name. The entries are sorted: a forged pod may list thousands.
func (q extendedQuantities) get(name corev1.ResourceName) (quantityEntry, bool) {
	i, ok := slices.BinarySearchFunc(q, name, func(e quantityEntry, name corev1.ResourceName) int {
		return strings.Compare(string(e.name), string(name))
	})
	if !ok {
		return quantityEntry{}, false
	}
	return q[i], true
}
