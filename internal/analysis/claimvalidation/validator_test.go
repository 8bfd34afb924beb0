package claimvalidation_test

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation/claimvalidationtest"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// TestValidateAsWritten is kubectl dra validate's path: YAML as written, decoded without an API
// server (so without its defaults) and judged.
func TestValidateAsWritten(t *testing.T) {
	v := claimvalidationtest.NewValidator(t, "testdata", claimvalidationtest.Inventory(t, "testdata"))
	for _, tc := range []struct {
		file     string
		denied   int
		warnings int
	}{
		{file: "testdata/valid/seed-v1beta1.yaml", warnings: 1},
		{file: "testdata/valid/seed-v1.yaml"},
		{file: "testdata/valid/first-available.yaml"},
	} {
		raw, err := os.ReadFile(tc.file)
		if err != nil {
			t.Fatal(err)
		}
		obj, err := resourceversion.Decode(raw, schema.GroupVersionKind{})
		if err != nil {
			t.Fatal(err)
		}
		res := v.Validate(t.Context(), obj)
		if len(res.Errors) != tc.denied || len(res.Warnings) != tc.warnings {
			t.Errorf("%s (%s): denied %q warnings %q", tc.file, obj.Arrived, res.ErrorMessages(), res.WarningMessages())
		}
	}
}

// TestFindingsAreFieldErrors: findings keep their field path and detail apart until printed.
func TestFindingsAreFieldErrors(t *testing.T) {
	cases := claimvalidationtest.RuleCases(t, "testdata")
	i := slices.IndexFunc(cases, func(c claimvalidationtest.RuleCase) bool {
		return c.Name == "several errors in one opaque config print together"
	})
	if i < 0 {
		t.Fatal("case not found")
	}
	raw, err := json.Marshal(claimvalidationtest.AsVersion(t, cases[i].Object, "v1beta1"))
	if err != nil {
		t.Fatal(err)
	}
	obj, err := resourceversion.Decode(raw, schema.GroupVersionKind{})
	if err != nil {
		t.Fatal(err)
	}
	res := claimvalidationtest.NewValidator(t, "testdata", claimvalidationtest.Inventory(t, "testdata")).Validate(t.Context(), obj)
	params := "spec.spec.devices.config[%d].opaque.parameters"
	for _, tc := range []struct {
		list   field.ErrorList
		fields []string
	}{
		{res.Errors, []string{
			"spec.spec.devices.requests[0].selectors[0].cel.expression",
			fmt.Sprintf(params, 0) + ".apiVersion",
			fmt.Sprintf(params, 0) + ".kind",
			fmt.Sprintf(params, 0) + ".sharing.spacePartitioningConfig",
			fmt.Sprintf(params, 1) + ".sharing.strategy",
		}},
		// The deprecation is about the object as a whole.
		{res.Warnings, []string{""}},
	} {
		var got []string
		for _, e := range tc.list {
			got = append(got, e.Field)
			if e.Detail == "" || (e.Field != "" && strings.HasPrefix(e.Detail, e.Field)) {
				t.Errorf("%s: detail %q", e.Field, e.Detail)
			}
		}
		if !slices.Equal(got, tc.fields) {
			t.Errorf("fields\n got: %q\nwant: %q", got, tc.fields)
		}
	}
	if got := res.Errors[0].Detail; got != `unknown attribute "modle"; this driver publishes index, model, uuid, driverVersion, partitionable, partition, full` {
		t.Errorf("detail of the selector finding: %q", got)
	}
}
