package podinject

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingapi "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// podGroupsServed is what a 1.37 API server needs to serve PodGroups with resourceClaims.
const (
	podGroupsRuntimeConfig = testapiserver.AllVersions + ",scheduling.k8s.io/v1beta1=true"
	podGroupsFeatureGates  = "GenericWorkload=true,DRAWorkloadResourceClaims=true"
)

func withPodGroupClient(cs kubernetes.Interface) []Option {
	return []Option{WithPodGroups(NewPodGroupClient(cs.Discovery()))}
}

// TestPodGroupIntegration runs the handler behind a real 1.37.2 kube-apiserver, once serving
// PodGroups (its gates and scheduling.k8s.io/v1beta1 on), with kube-controller-manager's claim
// controller making one claim per group for the pods the webhook wired to it, and once with its
// defaults, which serve none. Needs the 1.37.2 envtest assets and kube-controller-manager.
func TestPodGroupIntegration(t *testing.T) {
	assets := testapiserver.ReleaseAssetsDir(t, "1.37.2")
	t.Run("served", func(t *testing.T) {
		kcm := testapiserver.ReleaseBinary(t, "1.37.2", "kube-controller-manager")
		e := startEnvWith(t, withPodGroupClient, testapiserver.WithAssetsDir(assets),
			testapiserver.WithRuntimeConfig(podGroupsRuntimeConfig), testapiserver.WithFeatureGates(podGroupsFeatureGates))
		// The claim controller makes the groups' claims and tells each pod which one is its.
		e.srv.StartControllerManager(t, kcm, "resourceclaim", "--controllers=resourceclaim-controller", "--feature-gates="+podGroupsFeatureGates)
		ctx := context.Background()
		ns := e.namespace(t, "groups")
		createOneGPUTemplate(t, e, ns)
		for _, group := range []string{"group-1", "group-2"} {
			pg := &schedulingapi.PodGroup{
				ObjectMeta: metav1.ObjectMeta{Name: group},
				Spec: schedulingapi.PodGroupSpec{
					SchedulingPolicy: schedulingapi.PodGroupSchedulingPolicy{Gang: &schedulingapi.GangSchedulingPolicy{MinCount: 2}},
					ResourceClaims:   []schedulingapi.PodGroupResourceClaim{{Name: ClaimName, ResourceClaimTemplateName: ptr.To("one-gpu")}},
				},
			}
			created, err := e.cs.SchedulingV1beta1().PodGroups(ns).Create(ctx, pg, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(created.Spec.ResourceClaims) != 1 {
				t.Fatalf("the API server dropped the PodGroup's resourceClaims: %+v", created.Spec)
			}
			for _, name := range []string{group + "-a", group + "-b"} {
				pod := groupPod(name, group)
				got := e.createPod(t, ns, pod, metav1.CreateOptions{})
				if rc := got.Spec.ResourceClaims; len(rc) != 1 || rc[0].Name != ClaimName || ptr.Deref(rc[0].ResourceClaimTemplateName, "") != "one-gpu" {
					t.Errorf("pod %s: resourceClaims %s, want the group's: %s with template one-gpu", name, describeClaims(rc), ClaimName)
				}
				if got.Spec.SchedulingGroup == nil || ptr.Deref(got.Spec.SchedulingGroup.PodGroupName, "") != group {
					t.Errorf("pod %s: the API server dropped spec.schedulingGroup: %+v", name, got.Spec.SchedulingGroup)
				}
			}
		}
		checkOneClaimPerGroup(t, e, ns, map[string][]string{"group-1": {"group-1-a", "group-1-b"}, "group-2": {"group-2-a", "group-2-b"}})
		// No managed template: the group's own template decides.
		if list, err := e.templates.ResourceClaimTemplates(ns).List(ctx, metav1.ListOptions{LabelSelector: ManagedByLabel + "=" + ManagedBy}); err != nil || len(list.Items) != 0 {
			t.Errorf("managed templates %v, %v; want none", list, err)
		}
		_, err := e.cs.CoreV1().Pods(ns).Create(ctx, groupPod("orphan", "group-9"), metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), "spec.schedulingGroup.podGroupName: Not found: \"group-9\": PodGroup group-9 does not exist in namespace groups; create the PodGroup before its pods") {
			t.Errorf("pod of a missing group: %v", err)
		}
	})
	t.Run("not served", func(t *testing.T) {
		e := startEnvWith(t, withPodGroupClient, testapiserver.WithAssetsDir(assets))
		ns := e.namespace(t, "groups")
		warnings := &recordedWarnings{}
		cfg := rest.CopyConfig(e.srv.Config)
		cfg.WarningHandler = warnings
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var got *corev1.Pod
		got, err = cs.CoreV1().Pods(ns).Create(context.Background(), groupPod("worker", "group-1"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		checkWired(t, got, "app")
		if got := warnings.list(); !slices.Contains(got, NotServedWarning) {
			t.Errorf("warnings %q, want %q", got, NotServedWarning)
		}
	})
}

func groupPod(name, group string) *corev1.Pod {
	pod := gpuPod(name, map[string]string{"gpu.example.com/count": "1"}, "app")
	pod.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To(group)}
	return pod
}

func createOneGPUTemplate(t *testing.T, e *env, ns string) {
	t.Helper()
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "one-gpu"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.example.com"}}},
		}}},
	}
	if _, err := e.templates.ResourceClaimTemplates(ns).Create(context.Background(), tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// recordedWarnings keeps the warnings the API server sends.
type recordedWarnings struct {
	mu   sync.Mutex
	seen []string
}

func (r *recordedWarnings) HandleWarningHeader(_ int, _ string, text string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, text)
}

func (r *recordedWarnings) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

func describeClaims(claims []corev1.PodResourceClaim) string {
	var out []string
	for _, c := range claims {
		out = append(out, c.Name+": "+describeEntry(c))
	}
	return "[" + strings.Join(out, ", ") + "]"
}

// checkOneClaimPerGroup waits until the claim controller made each group's claim and gave it to
// the group's pods, then checks that the namespace holds one claim per group, owned by the group.
func checkOneClaimPerGroup(t *testing.T, e *env, ns string, pods map[string][]string) {
	t.Helper()
	ctx := context.Background()
	claimOf := map[string]string{}
	for group, members := range pods {
		eventually(t, "the claim of "+group, func() bool {
			pg, err := e.cs.SchedulingV1beta1().PodGroups(ns).Get(ctx, group, metav1.GetOptions{})
			if err != nil || len(pg.Status.ResourceClaimStatuses) != 1 {
				return false
			}
			claimOf[group] = ptr.Deref(pg.Status.ResourceClaimStatuses[0].ResourceClaimName, "")
			return claimOf[group] != ""
		})
		for _, name := range members {
			eventually(t, name+"'s claim status", func() bool {
				pod, err := e.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
				return err == nil && len(pod.Status.ResourceClaimStatuses) == 1
			})
			pod, _ := e.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if st := pod.Status.ResourceClaimStatuses[0]; st.Name != ClaimName || ptr.Deref(st.ResourceClaimName, "") != claimOf[group] {
				t.Errorf("pod %s uses claim %s as %s, want its group's %s", name, ptr.Deref(st.ResourceClaimName, ""), st.Name, claimOf[group])
			}
		}
	}
	claims, err := e.templates.ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(claims.Items) != len(pods) {
		t.Errorf("%d claims, want one per group (%d)", len(claims.Items), len(pods))
	}
	for _, c := range claims.Items {
		if owner := metav1.GetControllerOf(&c); owner == nil || owner.Kind != "PodGroup" || claimOf[owner.Name] != c.Name {
			t.Errorf("claim %s is controlled by %+v, want the PodGroup it was made for", c.Name, owner)
		}
	}
	if claimOf["group-1"] == claimOf["group-2"] {
		t.Errorf("both groups got claim %s", claimOf["group-1"])
	}
}
