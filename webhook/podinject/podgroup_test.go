package podinject

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// fakePodGroups serves the PodGroups a case lists.
type fakePodGroups struct {
	NotServed bool   `json:"notServed,omitempty"`
	Error     string `json:"error,omitempty"`
	// Groups are the PodGroups of the pod's namespace by name, each with its spec.resourceClaims.
	Groups map[string][]corev1.PodResourceClaim `json:"groups,omitempty"`
}

func (f *fakePodGroups) SharedClaims(_ context.Context, _, name string) (GroupClaims, error) {
	switch {
	case f.Error != "":
		return GroupClaims{}, errors.New(f.Error)
	case f.NotServed:
		return GroupClaims{}, nil
	}
	claims, found := f.Groups[name]
	return GroupClaims{Served: true, Found: found, Claims: claims}, nil
}

// podGroupCase is a case of testdata/podgroup-cases.yaml: a handlerCase on a cluster holding the
// case's PodGroups.
type podGroupCase struct {
	handlerCase
	PodGroups *fakePodGroups `json:"podGroups"`
}

// TestHandlePodGroups: annotated pods of a PodGroup get the group's claim where the group shares
// one named gpu-dra, GPUs of their own elsewhere, and a denial naming the field and the fix where
// the annotations and the group disagree.
func TestHandlePodGroups(t *testing.T) {
	for _, tc := range loadCases[podGroupCase](t, "testdata/podgroup-cases.yaml") {
		var opts []Option
		if tc.PodGroups != nil {
			opts = append(opts, WithPodGroups(tc.PodGroups))
		}
		runCase(t, tc.handlerCase, checkPatchedPod, opts...)
	}
}
