package servedfeatures

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// TestOnAPIServer asks a real kube-apiserver, with the flags each supported release is run with,
// and checks the answers against what its feature gates say. It runs on the release in
// KUBEBUILDER_ASSETS (make envtest-assets K8S_VERSION=1.32.13 / 1.34.2 / 1.37.2).
func TestOnAPIServer(t *testing.T) {
	type want struct {
		list     bool
		admin    AdminAccessSupport
		extended bool
		capacity bool
	}
	cases := map[string][]struct {
		name          string
		runtimeConfig string
		gates         string
		want          want
	}{
		"1.32": {
			{"seed flags", "resource.k8s.io/v1beta1=true", "DynamicResourceAllocation=true", want{false, AdminAccessDropped, false, false}},
			// The alpha gate keeps the field, and 1.32 has no namespace check.
			{"admin access alpha", "resource.k8s.io/v1beta1=true", "DynamicResourceAllocation=true,DRAAdminAccess=true", want{false, AdminAccessServed, false, false}},
		},
		"1.34": {
			{"defaults", "", "", want{true, AdminAccessNeedsLabel, false, false}},
			{"gates flipped", "", "DRAPrioritizedList=false,DRAAdminAccess=false,DRAExtendedResource=true,DRAConsumableCapacity=true", want{false, AdminAccessDropped, true, true}},
			{"v1beta1 only", testapiserver.V1Beta1Only, "", want{true, AdminAccessNeedsLabel, false, false}},
		},
		"1.37": {
			{"defaults", "", "", want{true, AdminAccessNeedsLabel, true, true}},
		},
	}
	minor := testapiserver.Minor(t)
	if cases[minor] == nil {
		t.Skipf("SKIPPED: no expectations for kube-apiserver %s", minor)
	}
	for _, tc := range cases[minor] {
		t.Run(minor+" "+tc.name, func(t *testing.T) {
			opts := []testapiserver.Option{testapiserver.WithFeatureGates(tc.gates)}
			if tc.runtimeConfig != "" {
				opts = append(opts, testapiserver.WithRuntimeConfig(tc.runtimeConfig))
			} else if minor != "1.34" {
				opts = append(opts, testapiserver.WithRuntimeConfig("resource.k8s.io/v1=true"))
			}
			srv := testapiserver.Start(t, opts...)
			ctx := t.Context()
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gpu-dra"}}
			if _, err := srv.Clientset.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			d := New(srv.Clientset, ns.Name)
			if got, err := d.PrioritizedList(ctx); err != nil || got != tc.want.list {
				t.Errorf("PrioritizedList = %v, %v; want %v", got, err, tc.want.list)
			}
			if got, err := d.AdminAccess(ctx); err != nil || got != tc.want.admin {
				t.Errorf("AdminAccess = %v, %v; want %v", got, err, tc.want.admin)
			}
			if got, err := d.ConsumableCapacity(ctx); err != nil || got != tc.want.capacity {
				t.Errorf("ConsumableCapacity = %v, %v; want %v", got, err, tc.want.capacity)
			}
			// What the chart does: write the class with the field, then read it back.
			class := &resourceapi.DeviceClass{
				ObjectMeta: metav1.ObjectMeta{Name: "gpu.example.com"},
				Spec:       resourceapi.DeviceClassSpec{ExtendedResourceName: ptr.To("gpu.example.com/gpu")},
			}
			stored, err := draclient.New(srv.Clientset).DeviceClasses().Create(ctx, class, metav1.CreateOptions{FieldValidation: metav1.FieldValidationIgnore})
			if err != nil {
				t.Fatal(err)
			}
			if got := d.ExtendedResources(ctx, []*resourceapi.DeviceClass{stored}); got != tc.want.extended {
				t.Errorf("ExtendedResources = %v, want %v", got, tc.want.extended)
			}
		})
	}
}
