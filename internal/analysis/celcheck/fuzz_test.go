package celcheck

import (
	"testing"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

// FuzzAnalyze: any expression compiles or fails with a message; nothing panics. Seeds:
// testdata/fuzz/FuzzAnalyze.
func FuzzAnalyze(f *testing.F) {
	c := New("gpu.example.com", deviceschema.DeviceSchema())
	f.Fuzz(func(t *testing.T, expr string) {
		a := c.Analyze(expr)
		if a.CompileError == "" && a.Issues == nil && len(expr) == 0 {
			t.Fatalf("empty expression compiled")
		}
	})
}
