package manifest

import (
	"bytes"
	"path/filepath"
	"testing"
)

// BenchmarkConvert measures a release bundle (mixed kinds) and a stream of 500 seed templates,
// the size of a large GitOps repository's DRA manifests.
func BenchmarkConvert(b *testing.B) {
	seed := read(b, filepath.Join(seedDir, "resourceclaimtemplate.v1beta1.yaml"))
	var many bytes.Buffer
	for range 500 {
		many.WriteString("---\n")
		many.Write(seed)
	}
	for _, bc := range []struct {
		name string
		data []byte
	}{
		{"bundle", read(b, "testdata/convert/mixed-stream.yaml")},
		{"500-templates", many.Bytes()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := Rewrite(bc.data, "v1"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
