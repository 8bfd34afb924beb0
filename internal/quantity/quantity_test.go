package quantity

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-dra/gpu-dra/internal/allocs"
)

// parseBudget is what one Parse may allocate, in bytes. Parsing a quantity MaxLength long with an
// exponent of MaxExponent takes a few hundred bytes; the hostile values below took megabytes (and
// seconds) through resource.ParseQuantity.
const parseBudget = 16 << 10

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in  string
		err error // nil: accepted, as resource.ParseQuantity reads it
	}{
		{in: "10Gi"},
		{in: "1"},
		{in: "+1"},
		{in: "-1"},
		{in: "0"},
		{in: "1.5"},
		{in: "1E"},
		{in: "1e3"},
		{in: "1e-9"},
		{in: "1e100"},
		{in: "1e-100"},
		{in: "1E+100"},
		{in: "0.000000000000000000000000000001e30"},
		{in: strings.Repeat("9", MaxLength)},
		{in: "1e-5000000", err: ErrExponent},
		{in: "1e-99999999", err: ErrExponent},
		{in: "1e5000000", err: ErrExponent},
		{in: "1E-101", err: ErrExponent},
		{in: "-1e+101", err: ErrExponent},
		{in: ".1e-5000000", err: ErrExponent},
		{in: "0.0000001E+5000000", err: ErrExponent},
		// Zero times any power of ten is parsed as cheaply: a model may be called "E5000".
		{in: "E5000"},
		{in: "0e-99999999"},
		{in: "-0.000e99999999"},
		{in: ".e-99999999", err: ErrSyntax},
		{in: "1e99999999999999999999", err: ErrExponent},
		{in: "1e-2147483648", err: ErrExponent},
		// int32 wraps 2^32 to 0 inside resource.ParseQuantity: refused rather than read as 1.
		{in: "1e4294967296", err: ErrExponent},
		{in: strings.Repeat("1", MaxLength+1), err: ErrTooLong},
		{in: strings.Repeat("1", 1<<20), err: ErrTooLong},
		{in: "0." + strings.Repeat("0", 1<<20) + "1", err: ErrTooLong},
		{in: "", err: ErrSyntax},
		{in: "e", err: ErrSyntax},
		// resource.ParseQuantity reads these as 0; Parse bounds the cost, not the syntax.
		{in: "E"},
		{in: "e5"},
		{in: "+"},
		{in: "1e", err: ErrSyntax},
		{in: "1e+", err: ErrSyntax},
		{in: "1eabc", err: ErrSyntax},
		{in: "--1", err: ErrSyntax},
		{in: " 1", err: ErrSyntax},
		{in: "1 ", err: ErrSyntax},
		{in: "1\t", err: ErrSyntax},
		{in: "١٠", err: ErrSyntax},   // Arabic-Indic digits
		{in: "１０Gi", err: ErrSyntax}, // fullwidth digits
		{in: "1e-５", err: ErrSyntax},
		{in: "10Gi\x00", err: ErrSyntax},
	} {
		t.Run(tc.in[:min(len(tc.in), 40)], func(t *testing.T) {
			var q resource.Quantity
			var err error
			allocated := allocs.Bytes(func() { q, err = Parse(tc.in) })
			if allocated > parseBudget {
				t.Errorf("Parse allocated %d bytes, want at most %d", allocated, parseBudget)
			}
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("Parse(%.40q) = %v, %v; want an error wrapping %q", tc.in, q.String(), err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.in, err)
			}
			want, err := resource.ParseQuantity(tc.in)
			if err != nil {
				t.Fatalf("resource.ParseQuantity(%q): %v", tc.in, err)
			}
			if q.Cmp(want) != 0 || q.String() != want.String() {
				t.Errorf("Parse(%q) = %s, resource.ParseQuantity = %s", tc.in, q.String(), want.String())
			}
		})
	}
}

// FuzzParse: Parse agrees with resource.ParseQuantity on whatever it lets through, and its cost
// stays within the budget whatever it is given.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"10Gi", "1e-5000000", "1e-99999999", "1.5e-100", "-0.0001E+18", "1E", "12345678901234567890"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var q resource.Quantity
		var err error
		if allocated := allocs.Bytes(func() { q, err = Parse(s) }); allocated > parseBudget {
			t.Fatalf("Parse(%.80q) allocated %d bytes, want at most %d", s, allocated, parseBudget)
		}
		if Check(s) != nil {
			if err == nil {
				t.Fatalf("Parse(%.80q) accepted what Check refuses", s)
			}
			return
		}
		want, werr := resource.ParseQuantity(s)
		if (err == nil) != (werr == nil) {
			t.Fatalf("Parse(%q) error %v, resource.ParseQuantity error %v", s, err, werr)
		}
		if err == nil && q.Cmp(want) != 0 {
			t.Fatalf("Parse(%q) = %s, resource.ParseQuantity = %s", s, q.String(), want.String())
		}
	})
}

// TestCostly: what no check may hand resource.ParseQuantity, and what it parses at once though
// Parse refuses it (a long text that is no number).
func TestCostly(t *testing.T) {
	for in, want := range map[string]bool{
		"1e-5000000":                   true,
		" 1e-5000000":                  false, // callers trim as the decoder does; ParseQuantity refuses a blank at once
		"-1E+5000000":                  true,
		".5e-200":                      true,
		strings.Repeat("1", 65):        true,
		"+" + strings.Repeat("0", 100): true,
		strings.Repeat("x", 1000):      false,
		"E5000":                        false,
		"10Gi":                         false,
		"":                             false,
	} {
		if got := Costly(in); got != want {
			t.Errorf("Costly(%.40q) = %t, want %t", in, got, want)
		}
	}
}
