package resourceversion

import (
	"fmt"
	"slices"

	"k8s.io/client-go/discovery"
)

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
			if IsKnown(v.Version) && !slices.Contains(served, v.Version) {
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
