package podgroups

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
)

// TestServedVersion: the newest version listing podgroups wins; a version of the group without
// them (v1's priorityclasses) does not count.
func TestServedVersion(t *testing.T) {
	for _, tc := range []struct {
		name   string
		served map[string][]string
		want   string
	}{
		{name: "1.37 with its defaults", served: map[string][]string{"v1": {"priorityclasses"}}, want: ""},
		{name: "1.37 with PodGroups", served: map[string][]string{"v1": {"priorityclasses"}, "v1beta1": {"workloads", "podgroups", "podgroups/status"}, "v1alpha3": {"podgroups"}}, want: "v1beta1"},
		{name: "1.37 with v1alpha3 only", served: map[string][]string{"v1": {"priorityclasses"}, "v1alpha3": {"podgroups"}}, want: "v1alpha3"},
		{name: "1.36 with PodGroups", served: map[string][]string{"v1": {"priorityclasses"}, "v1alpha2": {"workloads", "podgroups"}}, want: "v1alpha2"},
		{name: "workloads but no podgroups", served: map[string][]string{"v1alpha2": {"workloads"}}, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			d := cs.Discovery().(*fakediscovery.FakeDiscovery)
			for v, resources := range tc.served {
				list := &metav1.APIResourceList{GroupVersion: Group + "/" + v}
				for _, r := range resources {
					list.APIResources = append(list.APIResources, metav1.APIResource{Name: r})
				}
				d.Resources = append(d.Resources, list)
			}
			got, err := ServedVersion(d)
			if err != nil || got != tc.want {
				t.Errorf("ServedVersion = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
