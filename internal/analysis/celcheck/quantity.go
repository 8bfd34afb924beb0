package celcheck

import (
	"fmt"

	celast "github.com/google/cel-go/common/ast"

	"github.com/gpu-dra/gpu-dra/internal/quantity"
)

// quantityFunctions parse their string argument with resource.ParseQuantity when the selector
// runs, at a cost CEL's estimate does not see (it grows with the square of an exponent).
var quantityFunctions = map[string]bool{"quantity": true, "isQuantity": true}

// checkQuantity refuses a quantity parse whose cost cannot be bounded before the selector runs: a
// literal the bounded parser refuses, or a string computed by the expression. An attribute read
// is allowed: the inventory keeps no published string the bounded parser refuses.
func (w *walker) checkQuantity(call celast.CallExpr) {
	args := call.Args()
	if !quantityFunctions[call.FunctionName()] || call.IsMemberFunction() || len(args) != 1 || w.refused != "" {
		return
	}
	fn := call.FunctionName()
	if s, ok := stringLiteral(args[0]); ok {
		if err := quantity.Check(s); err != nil {
			w.refused = fmt.Sprintf("%s(%.40q): %v; write a plain quantity such as %s(\"10Gi\")", fn, s, err, fn)
		}
		return
	}
	if _, ok := w.refOf(args[0]); ok {
		return
	}
	w.refused = fmt.Sprintf("%s() of a string the expression computes, whose parsing cost cannot be bounded before it runs; pass a literal such as %s(\"10Gi\") or an attribute", fn, fn)
}
