package feasibility

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
)

// ClassExprs are the CEL expressions of a class's selectors.
func ClassExprs(class *resourceapi.DeviceClass) []string {
	return selectorExprs(class.Spec.Selectors)
}

func selectorExprs(selectors []resourceapi.DeviceSelector) []string {
	var exprs []string
	for _, sel := range selectors {
		if sel.CEL != nil {
			exprs = append(exprs, sel.CEL.Expression)
		}
	}
	return exprs
}

// Match finds the devices all exprs accept; false when one of them does not compile.
func (v *View) Match(ctx context.Context, s *Snapshot, exprs []string) (*Matches, bool) {
	var refs []celcheck.Ref
	opaque := false
	for _, e := range exprs {
		a := v.checker.Analyze(e)
		if a.CompileError != "" {
			return nil, false
		}
		refs = append(refs, a.Refs...)
		opaque = opaque || a.Opaque
	}
	return v.matchAll(ctx, s, exprs, dedupRefs(refs), opaque), true
}
