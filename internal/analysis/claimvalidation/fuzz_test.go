package claimvalidation_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation/claimvalidationtest"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

var fuzzKinds = []schema.GroupVersionKind{
	{Group: "resource.k8s.io", Version: "v1", Kind: "ResourceClaimTemplate"},
	{Group: "resource.k8s.io", Version: "v1", Kind: "ResourceClaim"},
	{Group: "resource.k8s.io", Version: "v1beta1", Kind: "ResourceClaimTemplate"},
	{Group: "resource.k8s.io", Version: "v1beta1", Kind: "ResourceClaim"},
	{Group: "resource.k8s.io", Version: "v1beta2", Kind: "ResourceClaimTemplate"},
	{Group: "resource.k8s.io", Version: "v1beta2", Kind: "ResourceClaim"},
	{},
}

// FuzzDecodeValidate drives the admission path below the HTTP layer (which would recover a
// panic and hide it): decode any version, convert to v1, analyze selectors and config, run the
// feasibility check. An input that takes over 10s counts as a crash too. Seeds:
// testdata/fuzz/FuzzDecodeValidate.
func FuzzDecodeValidate(f *testing.F) {
	v := claimvalidationtest.NewValidator(f, "testdata", claimvalidationtest.Inventory(f, "testdata"))
	f.Fuzz(func(t *testing.T, raw []byte, kind uint8) {
		gvk := fuzzKinds[int(kind)%len(fuzzKinds)]
		obj, err := resourceversion.Decode(raw, gvk)
		if err != nil {
			return
		}
		timer := time.AfterFunc(10*time.Second, func() { panic(fmt.Sprintf("SLOW INPUT %q kind %d", raw, kind)) })
		res := v.Validate(context.Background(), obj)
		timer.Stop()
		for _, m := range append(res.ErrorMessages(), res.WarningMessages()...) {
			if m == "" {
				t.Fatalf("empty message in %+v", res)
			}
		}
		for _, e := range append(res.Errors, res.Warnings...) {
			if e.Detail == "" {
				t.Fatalf("finding without a detail in %+v", res)
			}
		}
	})
}
