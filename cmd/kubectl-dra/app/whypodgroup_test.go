package app

import (
	"bytes"
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/utils/ptr"
)

// TestWhyPodOfPodGroup: `why pod/...` names the pod's PodGroup, and says where the cluster serves
// no PodGroups, as then the pod's claims are its own.
func TestWhyPodOfPodGroup(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "worker"},
		Spec: corev1.PodSpec{SchedulingGroup: &corev1.PodSchedulingGroup{PodGroupName: ptr.To("team")}}}
	for _, tc := range []struct {
		name    string
		served  bool
		want    string
		wantNot string
	}{
		{name: "served", served: true, want: "  in PodGroup team\n", wantNot: "serves no PodGroups"},
		{name: "not served", want: "  in PodGroup team, but this cluster serves no PodGroups (Kubernetes 1.37 with the feature gates GenericWorkload and DRAWorkloadResourceClaims and --runtime-config=scheduling.k8s.io/v1beta1=true): the pod's claims are its own and it is scheduled alone\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset(pod)
			if tc.served {
				d := cs.Discovery().(*fakediscovery.FakeDiscovery)
				d.Resources = append(d.Resources, &metav1.APIResourceList{GroupVersion: "scheduling.k8s.io/v1beta1",
					APIResources: []metav1.APIResource{{Name: "podgroups"}}})
			}
			scheme := metadatafake.NewTestScheme()
			if err := metav1.AddMetaToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			var out, errOut bytes.Buffer
			o := &whyOptions{streams: genericiooptions.IOStreams{Out: &out, ErrOut: &errOut}, driverName: "gpu.example.com"}
			src := &whySource{namespace: "default", client: &readClient{cs: cs, dra: draclient.New(cs), meta: metadatafake.NewSimpleMetadataClient(scheme)}, errOut: &errOut}
			if err := o.explain(context.Background(), src, targetPod, "worker"); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), tc.want) || (tc.wantNot != "" && strings.Contains(out.String(), tc.wantNot)) {
				t.Errorf("answer:\n%s\nwant the line %q", out.String(), tc.want)
			}
		})
	}
}
