package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
	"github.com/gpu-dra/gpu-dra/webhook/podinject"
)

// TestSharingThroughAPIServer runs the webhook binary's wiring behind a real kube-apiserver that
// stores a node's shared-memory GPUs as the plugin publishes them, with and without consumable
// capacity: where it is served, a claim for a 30Gi share is admitted quietly, one for 200Gi is
// warned about with the capacity named, one that fits but finds the GPUs' memory taken by
// allocated claims is warned about with their names, and a pod's memory annotation becomes a
// template trying a share first. Where it is not, the API server drops the capacity requests and
// the shared fields, nothing about capacity is said, and the annotation stays a selector.
func TestSharingThroughAPIServer(t *testing.T) {
	cases := map[string][]struct {
		name, gates string
		served      bool
	}{
		"1.32": {{"seed flags", "DynamicResourceAllocation=true", false}},
		"1.34": {
			{"defaults", "", false},
			{"consumable capacity on", "DRAConsumableCapacity=true", true},
		},
		"1.37": {{"defaults", "", true}},
	}
	minor := testapiserver.Minor(t)
	if cases[minor] == nil {
		t.Skipf("SKIPPED: no expectations for kube-apiserver %s", minor)
	}
	for _, tc := range cases[minor] {
		t.Run(minor+" "+tc.name, func(t *testing.T) {
			if minor == "1.32" {
				t.Skip("SKIPPED: 1.32 serves no resource.k8s.io/v1 to write the claims' status with; TestServedFeaturesThroughAPIServer covers its fallbacks")
			}
			testSharing(t, tc.gates, tc.served)
		})
	}
}

func testSharing(t *testing.T, gates string, served bool) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	validating := validatingConfig()
	validating.Webhooks[0].NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"gpu-dra"},
	}}}
	srv := testapiserver.Start(t, testapiserver.WithRuntimeConfig(testapiserver.AllVersions), testapiserver.WithFeatureGates(gates),
		testapiserver.WithWebhooks(envtest.WebhookInstallOptions{
			ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{validating},
			MutatingWebhooks:   []*admissionregistrationv1.MutatingWebhookConfiguration{mutatingConfig()},
		}))
	cs := srv.Clientset
	dra := draclient.New(cs)
	for _, ns := range []string{"gpu-dra", "team-a"} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.example.com"}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}}}}
	if _, err := dra.DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// What the plugin publishes for a shared-memory node group of two GPUs (80Gi, 100 compute).
	devices, err := simulated.New("node-a", nodegroups.GroupSpec{Count: 2, Sharing: &nodegroups.Sharing{Mode: nodegroups.SharedMemory}}).Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := dra.ResourceSlices().Create(ctx, &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "node-a-gpu"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: "gpu.example.com", NodeName: ptr.To("node-a"), Pool: resourceapi.ResourcePool{Name: "node-a", ResourceSliceCount: 1}, Devices: devices,
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if kept := ptr.Deref(stored.Spec.Devices[0].AllowMultipleAllocations, false); kept != served {
		t.Fatalf("API server kept allowMultipleAllocations: %v, want %v", kept, served)
	}

	startWebhook(ctx, t, srv, func(o *Options) {
		o.Namespace = "gpu-dra"
		o.DeviceClasses = []podinject.DeviceClass{{Name: "gpu.example.com"}}
	})

	// create creates a claim asking for memory (and 20 compute) of a GPU and returns the
	// API server's warnings.
	create := func(t *testing.T, name, memory string, dryRun bool) []string {
		t.Helper()
		var warnings warningRecorder
		cfg := rest.CopyConfig(srv.Config)
		cfg.WarningHandler = &warnings
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.example.com",
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					"memory": resource.MustParse(memory), "compute": resource.MustParse("20")}}}}}}}}
		var o metav1.CreateOptions
		if dryRun {
			o.DryRun = []string{metav1.DryRunAll}
		}
		if _, err := draclient.New(kubernetesFor(t, cfg)).ResourceClaims("team-a").Create(ctx, claim, o); err != nil {
			t.Fatalf("create claim %s: %v", name, err)
		}
		return warnings.messages
	}

	t.Run("30Gi share", func(t *testing.T) {
		if w := create(t, "share-30", "30Gi", false); len(w) > 0 {
			t.Errorf("warnings %q, want none", w)
		}
	})
	t.Run("200Gi share", func(t *testing.T) {
		w := strings.Join(create(t, "share-200", "200Gi", true), "\n")
		want := "nothing currently published can satisfy the claim: request gpu: 2 published devices match its class and selectors, but none can hold its capacity requests: memory 200Gi requested, at most 80Gi on a device"
		if served != strings.Contains(w, want) {
			t.Errorf("warnings %q; want %q: %v", w, want, served)
		}
	})
	t.Run("held now", func(t *testing.T) {
		if !served {
			t.Skip("SKIPPED: without consumable capacity no claim shares a GPU (each holds one whole; TestSharing covers held whole GPUs)")
		}
		// Two pods' claims, as the scheduler allocates them: 60Gi of each GPU.
		for i, dev := range []string{"gpu-0", "gpu-1"} {
			name := fmt.Sprintf("holder-%d", i)
			create(t, name, "60Gi", false)
			claim, err := dra.ResourceClaims("team-a").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: "gpu.example.com", Pool: "node-a", Device: dev, ShareID: ptr.To(types.UID(fmt.Sprintf("a9b2c3d4-0000-4000-8000-00000000000%d", i))),
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("60Gi"), "compute": resource.MustParse("20")},
			}}}}
			claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: fmt.Sprintf("pod-%d", i), UID: types.UID(fmt.Sprintf("uid-%d", i))}}
			if _, err := dra.ResourceClaims("team-a").UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		// The webhook's informer sees the allocations a moment later.
		want := "fits, but every matching GPU is held now: request gpu: 2 matching shared devices on node node-a have too little capacity left"
		deadline := time.Now().Add(30 * time.Second)
		for {
			w := strings.Join(create(t, "share-30-more", "30Gi", true), "\n")
			if strings.Contains(w, want) && strings.Contains(w, "node-a/gpu-0: compute 80 of 100 left, 20 requested; memory 20Gi of 80Gi left, 30Gi requested") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("warnings %q, want %q", w, want)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if w := create(t, "share-16", "16Gi", true); len(w) > 0 {
			t.Errorf("a 16Gi share fits beside them, but warnings %q", w)
		}
	})
	t.Run("memory annotation", func(t *testing.T) {
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "annotated", Annotations: map[string]string{
			"gpu.example.com/count": "1", "gpu.example.com/memory": "10Gi",
		}}, Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app", Image: "busybox"}}}}
		got, err := cs.CoreV1().Pods("team-a").Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tmpl, err := dra.ResourceClaimTemplates("team-a").Get(ctx, *got.Spec.ResourceClaims[0].ResourceClaimTemplateName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r := tmpl.Spec.Spec.Devices.Requests[0]
		share := len(r.FirstAvailable) == 2 && r.FirstAvailable[0].Capacity != nil && r.FirstAvailable[0].Capacity.Requests["memory"].Equal(resource.MustParse("10Gi"))
		selector := r.Exactly != nil && len(r.Exactly.Selectors) == 1 && strings.Contains(r.Exactly.Selectors[0].CEL.Expression, `quantity("10Gi")`)
		if share != served || selector == served {
			t.Errorf("template %s request %+v; want a share first: %v", tmpl.Name, r, served)
		}
	})
}
