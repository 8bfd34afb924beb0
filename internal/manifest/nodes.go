package manifest

import (
	yaml "go.yaml.in/yaml/v3"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// exactFields are the request fields v1beta1 keeps on the request itself and v1beta2/v1 keep under
// `exactly` (k8s.io/dynamic-resource-allocation/api/v1beta1.Convert_v1beta1_DeviceRequest_To_v1_DeviceRequest).
var exactFields = map[string]bool{
	"deviceClassName":   true,
	"selectors":         true,
	"allocationMode":    true,
	"count":             true,
	"adminAccess":       true,
	"tolerations":       true,
	"capacity":          true,
	"derivedAttributes": true,
}

const exactlyKey = "exactly"

// rewriteNodes edits the document tree of kind from version `from` to `to` in place: apiVersion,
// and for claims and templates the device requests. It never touches anything else; whether the
// result means the same as the scheme conversion is checked by the caller.
func rewriteNodes(doc *yaml.Node, kind, from, to string) {
	root := doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if v := lookup(root, "apiVersion"); v != nil {
		v.Value = resourceversion.Group + "/" + to
	}
	fromBeta1, toBeta1 := from == "v1beta1", to == "v1beta1"
	if fromBeta1 == toBeta1 {
		// v1beta2 and v1 share the request layout; DeviceClasses have the same spec everywhere.
		return
	}
	var requests *yaml.Node
	switch kind {
	case resourceversion.KindTemplate:
		requests = lookupPath(root, "spec", "spec", "devices", "requests")
	case resourceversion.KindClaim:
		requests = lookupPath(root, "spec", "devices", "requests")
	}
	if requests == nil || requests.Kind != yaml.SequenceNode {
		return
	}
	for _, r := range requests.Content {
		if r.Kind != yaml.MappingNode {
			continue
		}
		if toBeta1 {
			inlineExactly(r)
		} else {
			nestExactly(r)
		}
	}
}

// nestExactly moves the exact-request fields of a v1beta1 request into a new `exactly` mapping,
// placed where the first of them was; their comments move with them.
func nestExactly(req *yaml.Node) {
	if lookup(req, exactlyKey) != nil {
		return
	}
	var kept, moved []*yaml.Node
	at := -1
	for i := 0; i+1 < len(req.Content); i += 2 {
		k, v := req.Content[i], req.Content[i+1]
		if k.Kind == yaml.ScalarNode && exactFields[k.Value] {
			if at < 0 {
				at = len(kept)
			}
			moved = append(moved, k, v)
			continue
		}
		kept = append(kept, k, v)
	}
	if at < 0 {
		return
	}
	// v1 requests read name first; keep `exactly` after it even if a moved field preceded it.
	for i := 0; i+1 < len(kept); i += 2 {
		if kept[i].Kind == yaml.ScalarNode && kept[i].Value == "name" && i >= at {
			at = i + 2
		}
	}
	// Quote the new key like its siblings: a JSON document must stay JSON.
	key := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: exactlyKey, Style: moved[0].Style & (yaml.DoubleQuotedStyle | yaml.SingleQuotedStyle)}
	val := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Style: req.Style & yaml.FlowStyle, Content: moved}
	out := make([]*yaml.Node, 0, len(kept)+2)
	out = append(out, kept[:at]...)
	out = append(out, key, val)
	out = append(out, kept[at:]...)
	req.Content = out
}

// inlineExactly replaces a request's `exactly` mapping by its fields, at the same place.
func inlineExactly(req *yaml.Node) {
	for i := 0; i+1 < len(req.Content); i += 2 {
		k, v := req.Content[i], req.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Value != exactlyKey || v.Kind != yaml.MappingNode {
			continue
		}
		fields := v.Content
		if len(fields) > 0 && k.HeadComment != "" {
			// The comment above `exactly:` described the request's device choice; keep it above
			// the first of the fields that now carry it.
			fields[0].HeadComment = joinComments(k.HeadComment, fields[0].HeadComment)
		}
		out := make([]*yaml.Node, 0, len(req.Content)-2+len(fields))
		out = append(out, req.Content[:i]...)
		out = append(out, fields...)
		out = append(out, req.Content[i+2:]...)
		req.Content = out
		return
	}
}

func joinComments(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "\n" + b
}

// lookup returns the value of key in a mapping node, or nil.
func lookup(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Kind == yaml.ScalarNode && m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func lookupPath(m *yaml.Node, keys ...string) *yaml.Node {
	for _, k := range keys {
		m = lookup(m, k)
	}
	return m
}

// scalar returns the string value at keys, or "".
func scalar(m *yaml.Node, keys ...string) string {
	n := lookupPath(m, keys...)
	if n == nil || n.Kind != yaml.ScalarNode {
		return ""
	}
	return n.Value
}
