package claimadmission

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation/claimvalidationtest"
)

// TestVerdictsByKind: each admission counts once, under its verdict, its kind and the version it
// arrived in.
func TestVerdictsByKind(t *testing.T) {
	h := &Handler{Validator: newValidator(t, loadInventory(t))}
	var denied runtime.Object
	for _, tc := range claimvalidationtest.RuleCases(t, testdata) {
		if tc.Name == "unknown attribute" {
			denied = claimvalidationtest.AsVersion(t, tc.Object, "v1")
		}
	}
	if denied == nil {
		t.Fatal("no case \"unknown attribute\" in the rule cases")
	}
	for _, tc := range []struct {
		name                   string
		obj                    runtime.Object
		verdict, kind, version string
	}{
		{name: "claim", obj: validObject(t, "single-claim"), verdict: "allowed", kind: "ResourceClaim", version: "v1"},
		{name: "template", obj: validObject(t, "seed-v1"), verdict: "allowed", kind: "ResourceClaimTemplate", version: "v1"},
		{name: "deprecated template", obj: validObject(t, "seed-v1beta1"), verdict: "warned", kind: "ResourceClaimTemplate", version: "v1beta1"},
		{name: "denied template", obj: denied, verdict: "denied", kind: "ResourceClaimTemplate", version: "v1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counter := verdicts.WithLabelValues(tc.verdict, tc.kind, tc.version)
			before := testutil.ToFloat64(counter)
			total := testutil.CollectAndCount(verdicts)
			raw, err := json.Marshal(tc.obj)
			if err != nil {
				t.Fatal(err)
			}
			gvk := tc.obj.GetObjectKind().GroupVersionKind()
			h.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
				Kind: metav1.GroupVersionKind{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind}, Name: "x", Namespace: "default",
				Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}})
			if got := testutil.ToFloat64(counter) - before; got != 1 {
				t.Errorf("verdicts{verdict=%q, kind=%q, version=%q} rose by %v, want 1", tc.verdict, tc.kind, tc.version, got)
			}
			if got := testutil.CollectAndCount(verdicts); got > total+1 {
				t.Errorf("%d series after one review, %d before", got, total)
			}
		})
	}
}
