// Package podgroups tells which version of scheduling.k8s.io serves PodGroups (KEP-5729), if any.
package podgroups

import (
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
)

// Group is the API group of PodGroups.
const Group = "scheduling.k8s.io"

// Versions are the versions of scheduling.k8s.io that served PodGroups with resourceClaims, newest
// first: v1beta1 from 1.37, v1alpha3 on 1.37 too, v1alpha2 on 1.36. Their spec.resourceClaims have
// one shape, so a reader may use whichever is served.
var Versions = []string{"v1", "v1beta1", "v1alpha3", "v1alpha2"}

// Needs is what a 1.37 cluster needs to serve PodGroups with resourceClaims.
const Needs = "Kubernetes 1.37 with the feature gates GenericWorkload and DRAWorkloadResourceClaims and --runtime-config=scheduling.k8s.io/v1beta1=true"

// ServedVersion is the newest version of scheduling.k8s.io that serves podgroups, "" for none.
func ServedVersion(d discovery.DiscoveryInterface) (string, error) {
	for _, v := range Versions {
		list, err := d.ServerResourcesForGroupVersion(Group + "/" + v)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("discover %s/%s: %w", Group, v, err)
		}
		if slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == "podgroups" }) {
			return v, nil
		}
	}
	return "", nil
}
