package manifest

import (
	"bytes"
	"testing"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// FuzzConvert: any input, any target. Convert never panics; documents it does not convert keep
// their bytes; what it converts decodes strictly as the target version; converting again is a
// no-op. Seeds: testdata/fuzz/FuzzConvert plus the golden inputs.
func FuzzConvert(f *testing.F) {
	for _, tc := range goldenCases {
		f.Add(read(f, "testdata/convert/"+tc.file), uint8(0))
	}
	f.Fuzz(func(t *testing.T, data []byte, target uint8) {
		to := resourceversion.Known[int(target)%len(resourceversion.Known)]
		out, changes, _ := Rewrite(data, to)
		if out == nil {
			t.Fatal("no output for a valid target")
		}
		in, got := split(data), split(out)
		if len(in) != len(got) {
			t.Fatalf("%d documents in, %d out", len(in), len(got))
		}
		converted := map[int]bool{}
		for _, c := range changes {
			if c.Action == Converted {
				converted[c.Document] = true
			}
		}
		for i := range in {
			if !bytes.Equal(in[i].sep, got[i].sep) {
				t.Fatalf("document %d: separator changed", i+1)
			}
			if !converted[i+1] {
				if !bytes.Equal(in[i].body, got[i].body) {
					t.Fatalf("document %d changed without a conversion", i+1)
				}
				continue
			}
			if err := CheckStrict(got[i].body); err != nil {
				t.Fatalf("document %d: converted output does not decode: %v\n%s", i+1, err, got[i].body)
			}
		}
		again, changes2, _ := Rewrite(out, to)
		for _, c := range changes2 {
			if c.Action == Converted {
				t.Fatalf("second conversion converted document %d again", c.Document)
			}
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("second conversion changed the output")
		}
	})
}
