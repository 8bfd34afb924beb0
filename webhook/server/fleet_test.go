package server

import (
	"context"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
	"github.com/gpu-dra/gpu-dra/webhook/fleetmetrics/fleetmetricstest"
)

// TestFleetMetricsThroughAPIServer: the webhook's fleet gauges follow the ResourceSlices and
// ResourceClaims of a real API server, read through its informers: the published GPUs by model
// (test cluster: 26 of LATEST-GPU-MODEL, 6 of OLD-GPU-MODEL, one node with both), the allocated
// ones, and the claims a pod waits for; a claim's allocation moves it from one to the other.
func TestFleetMetricsThroughAPIServer(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv := testapiserver.Start(t, testapiserver.WithRuntimeConfig(testapiserver.AllVersions), testapiserver.WithFeatureGates("DRADeviceTaints=true"))
	populate(ctx, t, srv.Clientset)
	const ns = "default"
	claims := draclient.New(srv.Clientset).ResourceClaims(ns)
	create := func(name string, owner *metav1.OwnerReference) *resourceapi.ResourceClaim {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.example.com"}}}}}}
		if owner != nil {
			c.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		out, err := claims.Create(ctx, c, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create claim %s: %v", name, err)
		}
		return out
	}
	allocate := func(c *resourceapi.ResourceClaim, node, device string) {
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: "gpu.example.com", Pool: node, Device: device}}}}
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: c.Name + "-pod", UID: "pod-uid"}}
		if _, err := claims.UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("allocate claim %s: %v", c.Name, err)
		}
	}
	held := create("held", nil)
	allocate(held, "las5", "gpu-1") // las5's odd devices are OLD-GPU-MODEL
	waiting := create("waiting", &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "waiting-pod", UID: "pod-uid", Controller: ptr.To(true)})
	create("alone", nil)

	o := NewOptions()
	o.Namespace = ns
	h, err := newHandlers(srv.Clientset, o, &nodegroups.Config{})
	if err != nil {
		t.Fatal(err)
	}
	go h.run(ctx)

	expect := func(what string, want map[string]float64) {
		t.Helper()
		var got map[string]float64
		deadline := time.Now().Add(time.Minute)
		for {
			got = fleetmetricstest.Gather(t, h.fleet)
			if matchesAll(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: got %v, want %v", what, got, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	expect("first summary", map[string]float64{
		fleetmetricstest.Devices("LATEST-GPU-MODEL", "free"):      26,
		fleetmetricstest.Devices("LATEST-GPU-MODEL", "allocated"): 0,
		fleetmetricstest.Devices("OLD-GPU-MODEL", "free"):         5,
		fleetmetricstest.Devices("OLD-GPU-MODEL", "allocated"):    1,
		fleetmetricstest.Devices("OLD-GPU-MODEL", "unhealthy"):    0,
		fleetmetricstest.Pending("template", "0s"):                1,
		fleetmetricstest.Pending("standalone", "0s"):              1,
	})
	allocate(waiting, "las1", "gpu-0")
	expect("the waiting claim allocated", map[string]float64{
		fleetmetricstest.Devices("LATEST-GPU-MODEL", "free"):      25,
		fleetmetricstest.Devices("LATEST-GPU-MODEL", "allocated"): 1,
		fleetmetricstest.Pending("template", "0s"):                0,
		fleetmetricstest.Pending("standalone", "0s"):              1,
	})
	for k := range fleetmetricstest.Gather(t, h.fleet) {
		if strings.Contains(k, "NIC") || strings.Contains(k, `model=""`) {
			t.Errorf("a series of another driver's devices: %s", k)
		}
	}
	// A device tainted by its driver (the plugin's health taint) is unhealthy.
	dra := draclient.New(srv.Clientset)
	sl, err := dra.ResourceSlices().Get(ctx, "las2-gpu.example.com", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sl.Spec.Devices[3].Taints = []resourceapi.DeviceTaint{{Key: "gpu.example.com/xid", Value: "79", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	if _, err := dra.ResourceSlices().Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		if strings.Contains(err.Error(), "taints") {
			t.Skipf("this API server does not store device taints: %v", err)
		}
		t.Fatal(err)
	}
	if got, _ := dra.ResourceSlices().Get(ctx, sl.Name, metav1.GetOptions{}); len(got.Spec.Devices[3].Taints) == 0 {
		t.Logf("the API server dropped the device taint (DRADeviceTaints off); no unhealthy device to see")
		return
	}
	expect("a tainted device", map[string]float64{
		fleetmetricstest.Devices("LATEST-GPU-MODEL", "free"):      24,
		fleetmetricstest.Devices("LATEST-GPU-MODEL", "unhealthy"): 1,
	})
}

func matchesAll(got, want map[string]float64) bool {
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			return false
		}
	}
	return true
}
