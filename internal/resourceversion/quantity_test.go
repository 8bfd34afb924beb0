package resourceversion

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/gpu-dra/gpu-dra/internal/allocs"
	"github.com/gpu-dra/gpu-dra/internal/quantity"
)

// TestDecodeCostlyQuantity: a capacity request that resource.ParseQuantity would parse for a
// second or for minutes is refused before the decoder parses it, in every version, JSON or YAML,
// naming the field; the same text where no quantity is (a label, a driver's parameters) is not.
func TestDecodeCostlyQuantity(t *testing.T) {
	claim := func(version, request string) string {
		return fmt.Sprintf(`{"apiVersion":"resource.k8s.io/%s","kind":"ResourceClaim","metadata":{"name":"c","namespace":"ns","labels":{"x":"1e-5000000"}},
"spec":{"devices":{"requests":[{"name":"gpu",%s}],
"config":[{"opaque":{"driver":"d","parameters":{"capacity":{"requests":{"memory":"1e-99999999"}}}}}]}}}`, version, request)
	}
	v1 := func(value string) string {
		return fmt.Sprintf(`"exactly":{"deviceClassName":"gpu.example.com","capacity":{"requests":{"memory":%s}}}`, value)
	}
	v1beta1 := func(value string) string {
		return fmt.Sprintf(`"deviceClassName":"gpu.example.com","capacity":{"requests":{"memory":%s}}`, value)
	}
	for _, tc := range []struct {
		name, doc, field string
		want             error
	}{
		{name: "v1 string", doc: claim("v1", v1(`"1e-5000000"`)), field: "spec.devices.requests[0].exactly.capacity.requests[memory]", want: quantity.ErrExponent},
		{name: "v1 blanks", doc: claim("v1", v1(`" 1e-99999999 "`)), field: "spec.devices.requests[0].exactly.capacity.requests[memory]", want: quantity.ErrExponent},
		{name: "v1 number", doc: claim("v1", v1(`1E+5000000`)), field: "spec.devices.requests[0].exactly.capacity.requests[memory]", want: quantity.ErrExponent},
		{name: "v1 digits", doc: claim("v1", v1(`"`+strings.Repeat("7", 100000)+`"`)), field: "spec.devices.requests[0].exactly.capacity.requests[memory]", want: quantity.ErrTooLong},
		{name: "v1beta2", doc: claim("v1beta2", v1(`"1e-5000000"`)), field: "spec.devices.requests[0].exactly.capacity.requests[memory]", want: quantity.ErrExponent},
		{name: "v1beta1", doc: claim("v1beta1", v1beta1(`"1e-5000000"`)), field: "spec.devices.requests[0].capacity.requests[memory]", want: quantity.ErrExponent},
		{name: "firstAvailable", doc: claim("v1", `"firstAvailable":[{"name":"a","deviceClassName":"gpu.example.com","capacity":{"requests":{"gpu.example.com/memory":"1e-5000000"}}}]`),
			field: "spec.devices.requests[0].firstAvailable[0].capacity.requests[gpu.example.com/memory]", want: quantity.ErrExponent},
		{name: "template", doc: `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaimTemplate","metadata":{"name":"t","namespace":"ns"},
"spec":{"spec":{"devices":{"requests":[{"name":"gpu",` + v1(`"1e-5000000"`) + `}]}}}}`, field: "spec.spec.devices.requests[0].exactly.capacity.requests[memory]", want: quantity.ErrExponent},
		{name: "yaml", doc: "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      exactly:\n        deviceClassName: gpu.example.com\n        capacity: {requests: {memory: \"1e-5000000\"}}\n",
			field: "spec.devices.requests[0].exactly.capacity.requests[memory]", want: quantity.ErrExponent},
		{name: "plain quantity", doc: claim("v1", v1(`"10Gi"`))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if allocated := allocs.Bytes(func() { _, err = Decode([]byte(tc.doc), schema.GroupVersionKind{}) }); allocated > 1<<20+16*uint64(len(tc.doc)) {
				t.Errorf("Decode allocated %d bytes, want at most 1 MiB and 16 bytes per byte of the document (the decoding itself)", allocated)
			}
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.field+": ") {
				t.Fatalf("Decode: %v; want %q naming %s", err, tc.want, tc.field)
			}
			if _, _, err := DecodeStrict([]byte(tc.doc)); !errors.Is(err, tc.want) {
				t.Errorf("DecodeStrict: %v; want %q", err, tc.want)
			}
		})
	}
}
