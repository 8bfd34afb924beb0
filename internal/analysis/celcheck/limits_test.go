package celcheck

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

// TestExpressionSizeLimit: an expression longer than the API server stores is refused before it is
// compiled, with the limit in the message; one at the limit is analyzed as usual.
func TestExpressionSizeLimit(t *testing.T) {
	c := New("gpu.example.com", deviceschema.DeviceSchema())
	atLimit := literalExpression(resourceapi.CELSelectorExpressionMaxLength, 0)
	if a := c.Analyze(atLimit); a.CompileError != "" || !a.MentionsDriver {
		t.Errorf("expression of %d bytes: %+v, want it analyzed", len(atLimit), a)
	}
	over := literalExpression(resourceapi.CELSelectorExpressionMaxLength+1, 0)
	want := fmt.Sprintf("expression of %d bytes is longer than the %d bytes the API server accepts; shorten it", len(over), resourceapi.CELSelectorExpressionMaxLength)
	if a := c.Analyze(over); a.CompileError != want {
		t.Errorf("expression of %d bytes: compile error %q, want %q", len(over), a.CompileError, want)
	}
}

// TestCacheKeepsNoExpression: the analysis cache is keyed by the expression's digest, so what it
// retains does not grow with the expressions' length (it used to keep each whole expression, up to
// 4096 of them, of any size).
func TestCacheKeepsNoExpression(t *testing.T) {
	c := New("gpu.example.com", deviceschema.DeviceSchema())
	const n = 200
	kept := retained(func() {
		for i := range n {
			if a := c.Analyze(literalExpression(resourceapi.CELSelectorExpressionMaxLength, i)); a.CompileError != "" {
				t.Fatal(a.CompileError)
			}
		}
	})
	if kept > n*resourceapi.CELSelectorExpressionMaxLength/4 {
		t.Errorf("the cache keeps %d bytes for %d analyses of %d-byte expressions", kept, n, resourceapi.CELSelectorExpressionMaxLength)
	}
	runtime.KeepAlive(c)
}

// literalExpression is a valid selector of exactly size bytes, distinct for each seed.
func literalExpression(size, seed int) string {
	head := fmt.Sprintf(`device.driver == "gpu.example.com" || device.driver == "%d`, seed)
	return head + strings.Repeat("x", size-len(head)-1) + `"`
}

// retained is how much more heap is live after f than before.
func retained(f func()) int {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return int(after.HeapAlloc) - int(before.HeapAlloc)
}
