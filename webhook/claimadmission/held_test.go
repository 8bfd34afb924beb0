package claimadmission

import (
	"fmt"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation"
	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation/claimvalidationtest"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

type claimList []*resourceapi.ResourceClaim

func (c claimList) Claims() ([]*inventory.Claim, error) {
	out := make([]*inventory.Claim, len(c))
	for i, cl := range c {
		out[i] = inventory.KeepClaim(cl)
	}
	return out, nil
}

// TestHeldNow: a claim that fits the published GPUs but finds them all held is admitted with a
// warning naming the holders, even where the deny rules are on (a claim may wait); a template
// with the same spec is not warned about (its claims come later); once a GPU is free, no warning.
func TestHeldNow(t *testing.T) {
	st := &inventory.Objects{Classes: loadInventory(t).Classes, Nodes: []*v1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "small"}}},
		Slices: []*resourceapi.ResourceSlice{claimvalidationtest.GPUSlice("small", 2, "LATEST-GPU-MODEL", "", resource.MustParse("80Gi"))}}
	held := claimList{}
	for i := range 2 {
		held = append(held, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("hog-%d", i), Namespace: "team-a"},
			Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: claimvalidationtest.Driver, Pool: "small", Device: fmt.Sprintf("gpu-%d", i)}}}}}})
	}
	spec := `{"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}}`
	claim := []byte(`{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c", "namespace": "team-a"}, "spec": ` + spec + `}`)
	template := []byte(`{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "t", "namespace": "team-a"}, "spec": {"spec": ` + spec + `}}`)
	for _, tc := range []struct {
		name  string
		held  claimList
		raw   []byte
		warns bool
	}{
		{"claim, both GPUs held", held, claim, true},
		{"template, both GPUs held", held, template, false},
		{"claim, one GPU free", held[:1], claim, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := claimvalidation.New(claimvalidationtest.Driver, &nodegroups.Config{}, claimvalidation.Rules, st, claimvalidation.WithClaims(tc.held))
			obj, _, err := unstructuredFor(tc.raw)
			if err != nil {
				t.Fatal(err)
			}
			resp := review(t, &Handler{Validator: v}, obj, admissionv1.Create)
			want := "spec.devices: fits, but every matching GPU is held now: request gpu: 2 matching devices on node small are allocated to other claims; best node small has 0 available, 1 wanted (held by team-a/hog-0, team-a/hog-1)"
			got := strings.Join(resp.Warnings, "\n")
			if !resp.Allowed || (got == want) != tc.warns || (!tc.warns && got != "") {
				t.Errorf("allowed=%t warnings=%q; want allowed with the warning: %v", resp.Allowed, got, tc.warns)
			}
		})
	}
}
