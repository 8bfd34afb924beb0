// Package manifest rewrites multi-document YAML manifests (kubectl dra upgrade): it moves
// ResourceClaims, ResourceClaimTemplates and DeviceClasses to another resource.k8s.io version by
// editing the YAML node tree, so comments, key order and unrelated fields survive, and checks the
// result against the scheme conversion of internal/resourceversion. It also splits a stream into
// its documents for the commands that read manifests.
package manifest

import (
	"bytes"
)

// chunk is one document of a stream together with the separator line that preceded it. Joining
// the chunks of a stream gives back the input byte for byte.
type chunk struct {
	// sep is the "---" line (with its newline) before body, empty for the first document.
	sep []byte
	// body is the document's text.
	body []byte
}

// split cuts a YAML stream at its document separators ("---" at the start of a line, as
// k8s.io/apimachinery's YAML reader does). Block scalars cannot contain such a line because their
// content is indented, so a line-based cut is exact for manifests.
func split(data []byte) []chunk {
	var out []chunk
	cur := chunk{}
	start := 0
	for start < len(data) {
		end := bytes.IndexByte(data[start:], '\n')
		line := data[start:]
		if end >= 0 {
			line = data[start : start+end+1]
		}
		if isSeparator(line) {
			out = append(out, cur)
			cur = chunk{sep: line}
		} else {
			cur.body = append(cur.body, line...)
		}
		start += len(line)
	}
	return append(out, cur)
}

func isSeparator(line []byte) bool {
	if !bytes.HasPrefix(line, []byte("---")) {
		return false
	}
	rest := line[3:]
	return len(rest) == 0 || rest[0] == ' ' || rest[0] == '\t' || rest[0] == '\n' || rest[0] == '\r'
}

func join(chunks []chunk) []byte {
	b := bytes.NewBuffer([]byte{})
	for _, c := range chunks {
		b.Write(c.sep)
		b.Write(c.body)
	}
	return b.Bytes()
}

// isEmpty reports whether a document holds nothing but whitespace and comments.
func isEmpty(body []byte) bool {
	for _, line := range bytes.Split(body, []byte("\n")) {
		t := bytes.TrimSpace(line)
		if len(t) > 0 && t[0] != '#' {
			return false
		}
	}
	return true
}
