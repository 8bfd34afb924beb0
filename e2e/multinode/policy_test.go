package multinode

import (
	"context"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

const nodeNameClaim = "authentication.kubernetes.io/node-name"

// TestPolicyBetweenPlugins is the plugin's ValidatingAdmissionPolicy between two real plugins:
// with a token the API server issues for the plugin's pod on one node (what the kubelet mounts
// into it: bound to the pod, carrying its node), writing or deleting the other node's slice is
// refused with the policy's message, while the same writes of its own node's slice pass. All
// writes are dry runs, so a policy that let one through would change nothing.
func TestPolicyBetweenPlugins(t *testing.T) {
	c, nodes := setup(t, 2)
	install(t, c, nodes)
	ctx := context.Background()
	plugins := pluginPods(t, c)
	byNode, err := slicesByNode(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, pair := range [][2]node{{nodes[0], nodes[1]}, {nodes[1], nodes[0]}} {
		own, other := pair[0], pair[1]
		pod, ok := plugins[own.Name]
		if !ok {
			t.Fatalf("no plugin pod on %s", own.Name)
		}
		asPlugin := pluginClient(t, c, pod)
		// The token is the plugin's: its service account, and the node the policy reads.
		review, err := asPlugin.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		user := review.Status.UserInfo
		if got := user.Extra[nodeNameClaim]; len(got) != 1 || got[0] != own.Name {
			t.Fatalf("the plugin's token on %s: user %s carries %s=%v, want [%s]", own.Name, user.Username, nodeNameClaim, got, own.Name)
		}
		t.Logf("plugin %s on %s authenticates as %s with %s=%s", pod.Name, own.Name, user.Username, nodeNameClaim, own.Name)

		api := asPlugin.ResourceV1().ResourceSlices()
		dry := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
		want := "the kubelet plugin on node " + own.Name + " may only write ResourceSlices with spec.nodeName " + own.Name
		for _, target := range []node{own, other} {
			if len(byNode[target.Name]) != 1 {
				t.Fatalf("node %s has slices %v, want one", target.Name, byNode[target.Name])
			}
			s, err := api.Get(ctx, byNode[target.Name][0], metav1.GetOptions{})
			if err != nil {
				t.Fatalf("the plugin on %s reads %s's slice: %v", own.Name, target.Name, err)
			}
			s.Labels = map[string]string{"e2e.gpu.example.com/touched-by": own.Name}
			_, errUpdate := api.Update(ctx, s, dry)
			errDelete := api.Delete(ctx, s.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
			fresh := &resourcev1.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{GenerateName: target.Name + "-e2e-"},
				Spec:       *s.Spec.DeepCopy(),
			}
			fresh.Spec.Pool.Name = target.Name + "-e2e"
			_, errCreate := api.Create(ctx, fresh, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			for op, err := range map[string]error{"update": errUpdate, "delete": errDelete, "create": errCreate} {
				switch {
				case target.Name == own.Name && err != nil:
					t.Errorf("the plugin on %s may %s its own node's slice (dry run), got: %v", own.Name, op, err)
				case target.Name != own.Name && err == nil:
					t.Errorf("the plugin on %s could %s %s's slice", own.Name, op, target.Name)
				case target.Name != own.Name && !strings.Contains(err.Error(), want):
					t.Errorf("the plugin on %s, %s of %s's slice: refused with %q, want the policy's %q", own.Name, op, target.Name, err, want)
				case target.Name != own.Name:
					t.Logf("%s of %s's slice by the plugin on %s: %v", op, target.Name, own.Name, err)
				}
			}
		}
	}
}

// pluginClient is a client with a token of the plugin pod's service account bound to the pod, as
// the kubelet requests for the pod's projected token: the API server adds the pod's node.
func pluginClient(t *testing.T, c *framework.Cluster, pod corev1.Pod) kubernetes.Interface {
	t.Helper()
	tr, err := c.Clientset.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(context.Background(), pod.Spec.ServiceAccountName,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	anon := rest.AnonymousClientConfig(cfg)
	anon.BearerToken = tr.Status.Token
	return kubernetes.NewForConfigOrDie(anon)
}
