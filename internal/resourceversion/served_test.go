package resourceversion

import (
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
)

func TestServedAndNewest(t *testing.T) {
	tests := []struct {
		served     []string
		wantServed []string
		want       string
		wantErr    string
	}{
		{served: []string{"v1", "v1beta2", "v1beta1"}, wantServed: []string{"v1", "v1beta2", "v1beta1"}, want: "v1"},
		{served: []string{"v1beta1", "v1"}, wantServed: []string{"v1", "v1beta1"}, want: "v1"},
		{served: []string{"v1beta1"}, wantServed: []string{"v1beta1"}, want: "v1beta1"},
		{served: []string{"v1beta2", "v1beta1"}, wantServed: []string{"v1beta2", "v1beta1"}, want: "v1beta2"},
		{served: nil, wantErr: "enable Dynamic Resource Allocation"},
		{served: []string{"v1alpha3"}, wantErr: "serves none of resource.k8s.io"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.served, ","), func(t *testing.T) {
			disc := fake.NewClientset().Discovery().(*fakediscovery.FakeDiscovery)
			for _, v := range tc.served {
				disc.Resources = append(disc.Resources, &metav1.APIResourceList{GroupVersion: Group + "/" + v,
					APIResources: []metav1.APIResource{{Name: "resourceslices"}}})
			}
			// Another group's versions must not count.
			disc.Resources = append(disc.Resources, &metav1.APIResourceList{GroupVersion: "example.com/v1",
				APIResources: []metav1.APIResource{{Name: "things"}}})
			served, err := Served(disc)
			if err != nil || !slices.Equal(served, tc.wantServed) {
				t.Errorf("Served = %q, %v; want %q", served, err, tc.wantServed)
			}
			got, err := Newest(disc)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Newest err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("Newest = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
