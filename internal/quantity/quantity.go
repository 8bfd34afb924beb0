// Package quantity parses quantities that come from outside (annotations, container resources,
// CEL literals, published attributes, configuration) at a bounded cost.
//
// resource.ParseQuantity cannot be interrupted and its cost grows with the square of a decimal
// exponent's magnitude: "1e-5000000" (10 bytes) takes about a second, "1e-99999999" minutes.
// Parse checks the length and the exponent on the string first, so only strings whose parsing is
// known to be cheap ever reach it.
package quantity

import (
	"errors"
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"
)

const (
	// MaxLength bounds the text of a quantity. Real amounts are written in a few characters
	// ("80Gi", "9223372036854775807", "0.000000001"); 64 leaves room for any way of writing one
	// (and is the longest string attribute a ResourceSlice may publish), while the parsing cost
	// of a long string of digits grows with the square of its length.
	MaxLength = 64
	// MaxExponent bounds a decimal exponent (the "e" suffix) either way. A Quantity rounds what
	// is below 1e-9 up to it and holds at most a few dozen digits a real amount of anything needs,
	// while the parsing cost grows with the exponent's square.
	MaxExponent = 100
)

// Errors Parse returns, wrapped with the value's details; callers add the field and the fix.
var (
	ErrTooLong  = errors.New("longer than " + strconv.Itoa(MaxLength) + " bytes")
	ErrExponent = errors.New("exponent out of range")
	ErrSyntax   = errors.New("not a quantity")
)

// Parse is resource.ParseQuantity with its cost bounded: it refuses, before parsing, a string
// longer than MaxLength or with a decimal exponent beyond ±MaxExponent, and otherwise accepts
// exactly what resource.ParseQuantity does. The string is taken as written (no blanks trimmed).
// Errors wrap ErrTooLong, ErrExponent or ErrSyntax.
func Parse(s string) (resource.Quantity, error) {
	if err := Check(s); err != nil {
		return resource.Quantity{}, err
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return resource.Quantity{}, fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	return q, nil
}

// Check reports whether Parse would reach resource.ParseQuantity with s: nil when s is short and
// any exponent small, whether or not s is a valid quantity. It allocates nothing on success.
func Check(s string) error { return check(s) }

// Costly reports whether resource.ParseQuantity could spend more than a moment on s: Check refuses
// it, and s starts as a number does. A string that does not, however long, is refused by
// resource.ParseQuantity before any arithmetic: it is no quantity, but not a costly one.
func Costly(s string) bool { return costly(s) }

func costly[T ~string | ~[]byte](s T) bool {
	return len(s) > 0 && (s[0] >= '0' && s[0] <= '9' || s[0] == '+' || s[0] == '-' || s[0] == '.') && check(s) != nil
}

// check is Check of a string or of the bytes of one, which it does not copy.
func check[T ~string | ~[]byte](s T) error {
	if len(s) > MaxLength {
		return fmt.Errorf("%w (%d bytes)", ErrTooLong, len(s))
	}
	exp, ok := exponent(s)
	if !ok {
		return nil
	}
	n, err := strconv.ParseInt(string(exp), 10, 32)
	if errors.Is(err, strconv.ErrSyntax) {
		// resource.ParseQuantity refuses it as cheaply.
		return nil
	}
	if err != nil || n > MaxExponent || n < -MaxExponent {
		return fmt.Errorf("%w (at most e%d or e-%d)", ErrExponent, MaxExponent, MaxExponent)
	}
	return nil
}

// exponent returns the digits (with their sign) of a decimal exponent suffix as
// resource.ParseQuantity reads it: after an optional sign, digits and an optional fraction, an "e"
// or "E" followed by more. A lone "E" is the SI suffix exa, not an exponent. An exponent of zero
// (no digit but 0 before it, as in a model name "E5000") costs nothing and is not reported.
func exponent[T ~string | ~[]byte](s T) (T, bool) {
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	nonzero := false
	for ; i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.'); i++ {
		nonzero = nonzero || s[i] >= '1' && s[i] <= '9'
	}
	if nonzero && i+1 < len(s) && (s[i] == 'e' || s[i] == 'E') {
		return s[i+1:], true
	}
	return s[:0], false
}
