// Package servedversion tells which resource.k8s.io versions an API server serves. The plugin,
// kubectl dra and the tests all pick the version to talk in from it, so a 1.32 cluster (v1beta1
// only) and a 1.36 one (v1 only) are told apart the same way everywhere.
package servedversion

import (
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	"k8s.io/client-go/discovery"
)

// Group is the API group of DRA's objects.
const Group = resourceapi.GroupName

// Known are the versions k8s.io/dynamic-resource-allocation/client converts to and from, newest
// first.
var Known = []string{resourceapi.SchemeGroupVersion.Version, resourcev1beta2.SchemeGroupVersion.Version, resourcev1beta1.SchemeGroupVersion.Version}

// Served returns the versions of Group the server serves that are Known, newest first.
func Served(d discovery.ServerGroupsInterface) ([]string, error) {
	groups, err := d.ServerGroups()
	if err != nil {
		return nil, fmt.Errorf("discover API groups: %w", err)
	}
	var served []string
	for _, g := range groups.Groups {
		if g.Name != Group {
			continue
		}
		for _, v := range g.Versions {
			if slices.Contains(Known, v.Version) && !slices.Contains(served, v.Version) {
				served = append(served, v.Version)
			}
		}
	}
	slices.SortFunc(served, func(a, b string) int { return slices.Index(Known, a) - slices.Index(Known, b) })
	return served, nil
}

// Newest returns the newest Known version the server serves, or an error that says how to
// enable DRA.
func Newest(d discovery.ServerGroupsInterface) (string, error) {
	served, err := Served(d)
	if err != nil {
		return "", err
	}
	if len(served) == 0 {
		return "", fmt.Errorf("the API server serves none of %s %v: enable Dynamic Resource Allocation "+
			"(Kubernetes 1.32/1.33: --feature-gates=DynamicResourceAllocation=true and --runtime-config=resource.k8s.io/v1beta1=true)",
			Group, Known)
	}
	return served[0], nil
}
