package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	yaml "go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// Action says what happened to one document.
type Action string

const (
	// Converted: the document now has the target version.
	Converted Action = "converted"
	// Unchanged: the document already had the target version; its bytes are kept.
	Unchanged Action = "unchanged"
	// Skipped: a resource.k8s.io object of a version this package does not know; its bytes are
	// kept.
	Skipped Action = "skipped"
	// Failed: the document is not YAML or does not decode strictly; its bytes are kept and Err
	// says why.
	Failed Action = "failed"
)

// Change describes one ResourceClaim, ResourceClaimTemplate or DeviceClass document. Other
// documents pass through without a Change.
type Change struct {
	// Document is the 1-based position of the document in the stream.
	Document  int
	Kind      string
	Namespace string
	Name      string
	// From and To are resource.k8s.io versions.
	From, To string
	Action   Action
	// Rendered is set when the node rewrite did not decode to the same object as the scheme
	// conversion and the output was rendered from the converted object instead: the content is
	// right, but comments and key order are lost. Reason says what differed.
	Rendered bool
	Reason   string
	Err      error
}

// Upgraded reports whether the conversion went to a newer version.
func (c Change) Upgraded() bool { return versionRank(c.To) < versionRank(c.From) }

func versionRank(v string) int {
	for i, known := range resourceversion.Known {
		if v == known {
			return i
		}
	}
	return len(resourceversion.Known)
}

// Rewrite rewrites every ResourceClaim, ResourceClaimTemplate and DeviceClass of a multi-document
// YAML stream to resource.k8s.io/<to>. All other bytes, including other documents and the
// separators, are kept as they are. Documents that fail are kept unchanged and reported with Err
// set; the returned error is non-nil when any did.
func Rewrite(data []byte, to string) ([]byte, []Change, error) {
	if !resourceversion.IsKnown(to) {
		return nil, nil, fmt.Errorf("target version %q: use one of %s", to, strings.Join(resourceversion.Known, ", "))
	}
	chunks := split(data)
	var changes []Change
	var errs []error
	for i := range chunks {
		c, ok := convertDocument(&chunks[i], i+1, to)
		if !ok {
			continue
		}
		if c.Err != nil {
			errs = append(errs, fmt.Errorf("document %d (%s %s): %w", c.Document, c.Kind, c.Name, c.Err))
		}
		changes = append(changes, c)
	}
	return join(chunks), changes, errors.Join(errs...)
}

// header is the part of a document that decides whether it is ours.
type header struct {
	gvk             schema.GroupVersionKind
	namespace, name string
}

func readHeader(root *yaml.Node) header {
	gv, _ := schema.ParseGroupVersion(scalar(root, "apiVersion"))
	return header{
		gvk:       gv.WithKind(scalar(root, "kind")),
		namespace: scalar(root, "metadata", "namespace"),
		name:      scalar(root, "metadata", "name"),
	}
}

// convertDocument converts c in place; ok is false for documents that are not ours.
func convertDocument(c *chunk, index int, to string) (Change, bool) {
	if isEmpty(c.body) {
		return Change{}, false
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(c.body, &doc); err != nil {
		if !bytes.Contains(c.body, []byte(resourceversion.Group)) {
			return Change{}, false
		}
		// It mentions resource.k8s.io, so it may well be one of ours: do not pass it silently.
		return Change{Document: index, Action: Failed, Err: fmt.Errorf("not valid YAML: %w", err)}, true
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return Change{}, false
	}
	h := readHeader(doc.Content[0])
	if h.gvk.Group != resourceversion.Group || (h.gvk.Kind != resourceversion.KindClaim && h.gvk.Kind != resourceversion.KindTemplate && h.gvk.Kind != resourceversion.KindDeviceClass) {
		return Change{}, false
	}
	ch := Change{Document: index, Kind: h.gvk.Kind, Namespace: h.namespace, Name: h.name, From: h.gvk.Version, To: to}
	if !convertible(h.gvk) {
		ch.Action = Skipped
		ch.Reason = fmt.Sprintf("resource.k8s.io/%s is not one of %s", h.gvk.Version, strings.Join(resourceversion.Known, ", "))
		return ch, true
	}
	src, _, err := resourceversion.DecodeStrict(c.body)
	if err != nil {
		ch.Action = Failed
		ch.Err = fmt.Errorf("%w; fix the field for resource.k8s.io/%s before converting", err, h.gvk.Version)
		return ch, true
	}
	if h.gvk.Version == to {
		ch.Action = Unchanged
		return ch, true
	}
	want, err := resourceversion.To(src, to)
	if err != nil {
		ch.Action = Failed
		ch.Err = err
		return ch, true
	}
	ch.Action = Converted

	style := detectStyle(doc.Content[0])
	rewriteNodes(&doc, h.gvk.Kind, h.gvk.Version, to)
	out, err := encode(&doc, style)
	if err == nil {
		err = sameObject(out, want)
	}
	if err != nil {
		ch.Rendered = true
		ch.Reason = err.Error()
		out, err = render(want)
		if err != nil {
			ch.Action = Failed
			ch.Err = fmt.Errorf("render converted object: %w", err)
			return ch, true
		}
	}
	if bytes.Contains(c.body, []byte("\r\n")) {
		// The YAML encoder writes \n; keep the file's Windows line endings.
		out = bytes.ReplaceAll(out, []byte("\n"), []byte("\r\n"))
	}
	c.body = keepSurroundingBlankLines(c.body, out)
	return ch, true
}

// sameObject checks that the rewritten document decodes to exactly the converted object.
func sameObject(rewritten []byte, want any) error {
	got, _, err := resourceversion.DecodeStrict(rewritten)
	if err != nil {
		return fmt.Errorf("rewritten document does not decode: %w", err)
	}
	if !equality.Semantic.DeepEqual(got, want) {
		return errors.New("rewritten document differs from the scheme conversion")
	}
	return nil
}

// style is the indentation the input used, so the rewritten document looks like it.
type style struct {
	indent        int
	compactSeqs   bool
	haveIndent    bool
	haveSeqIndent bool
}

// detectStyle reads the mapping indentation and whether block sequences are indented under their
// key ("key:\n  - a") or not ("key:\n- a", kubectl's style).
func detectStyle(root *yaml.Node) style {
	s := style{indent: 2, compactSeqs: true}
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode && n.Style&yaml.FlowStyle == 0 {
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				switch {
				case v.Kind == yaml.MappingNode && v.Style&yaml.FlowStyle == 0 && len(v.Content) > 0 && !s.haveIndent && v.Content[0].Line > k.Line:
					if d := v.Content[0].Column - k.Column; d > 0 {
						s.indent, s.haveIndent = d, true
					}
				case v.Kind == yaml.SequenceNode && v.Style&yaml.FlowStyle == 0 && len(v.Content) > 0 && !s.haveSeqIndent && v.Line > k.Line:
					s.compactSeqs, s.haveSeqIndent = v.Column == k.Column, true
				}
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(root)
	return s
}

func encode(doc *yaml.Node, s style) ([]byte, error) {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(s.indent)
	if s.compactSeqs {
		enc.CompactSeqIndent()
	}
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return b.Bytes(), nil
}

// keepSurroundingBlankLines carries the blank lines before and after the original document over
// to its replacement, so the stream's layout between documents does not change.
func keepSurroundingBlankLines(orig, repl []byte) []byte {
	lead := 0
	for lead < len(orig) && (orig[lead] == '\n' || orig[lead] == '\r') {
		lead++
	}
	trail := len(orig)
	for trail > lead && (orig[trail-1] == '\n' || orig[trail-1] == '\r' || orig[trail-1] == ' ' || orig[trail-1] == '\t') {
		trail--
	}
	tail := orig[trail:]
	// The replacement ends with its own newline; keep only the extra blank lines.
	if i := bytes.IndexByte(tail, '\n'); i >= 0 {
		tail = tail[i+1:]
	} else {
		// The original had no final newline: neither should the replacement.
		repl = bytes.TrimRight(repl, "\r\n")
	}
	out := make([]byte, 0, lead+len(repl)+len(tail))
	out = append(out, orig[:lead]...)
	out = append(out, repl...)
	return append(out, tail...)
}
