package devicestatus

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	resourcev1ac "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// allocated creates a claim and allocates devices of node-a to it (plus one device of another
// driver), as the scheduler would, in whatever version the server serves.
func allocated(t *testing.T, cs kubernetes.Interface, name string, devices ...string) *resourceapi.ResourceClaim {
	t.Helper()
	ctx := t.Context()
	claims := draclient.New(cs)
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name:    "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: testDriver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(len(devices))},
		}}}},
	}
	created, err := claims.ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	alloc := &resourceapi.AllocationResult{}
	for _, d := range devices {
		alloc.Devices.Results = append(alloc.Devices.Results, resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: testDriver, Pool: "node-a", Device: d})
	}
	alloc.Devices.Results = append(alloc.Devices.Results, resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: "nic.example.com", Pool: "node-a", Device: "eth0"})
	created.Status.Allocation = alloc
	updated, err := claims.ResourceClaims("default").UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return updated
}

func nodeDevices(names ...string) []Device {
	var out []Device
	for i, n := range names {
		out = append(out, Device{Pool: "node-a", Name: n, Attributes: gpuAttributes(i, "LATEST-GPU-MODEL")})
	}
	return out
}

// patches counts the status writes a client sends.
type patches struct{ n atomic.Int32 }

func (p *patches) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodPatch && strings.HasSuffix(r.URL.Path, "/status") {
			p.n.Add(1)
		}
		return rt.RoundTrip(r)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func startWriter(t *testing.T, srv *testapiserver.Server, version string) (*Writer, ktesting.Buffer, *patches) {
	t.Helper()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	count := &patches{}
	cfg := rest.CopyConfig(srv.Config)
	cfg.Wrap(count.wrap)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(cs, testDriver, version, WithRetry(3, 10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Start(klog.NewContext(context.Background(), logger)))
	return w, logger.GetSink().(ktesting.Underlier).GetBuffer(), count
}

func waitIdle(t *testing.T, w *Writer) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return w.Pending() == 0, nil
	})
	if err != nil {
		t.Fatalf("writer still has %d claims pending", w.Pending())
	}
}

func getClaim(t *testing.T, cs kubernetes.Interface, name string) *resourceapi.ResourceClaim {
	t.Helper()
	c, err := cs.ResourceV1().ResourceClaims("default").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAPIServer writes claim status through a real kube-apiserver (1.34: status.devices beta, on)
// in each served version, and checks what a user reads back.
func TestAPIServer(t *testing.T) {
	srv := testapiserver.Start(t)
	cs := srv.Clientset
	for _, version := range []string{"v1", "v1beta2", "v1beta1"} {
		t.Run(version, func(t *testing.T) {
			w, logs, writes := startWriter(t, srv, version)
			claim := allocated(t, cs, "claim-"+version, "gpu-0", "gpu-3")
			// Another writer's entry of the other driver's device stays.
			_, err := cs.ResourceV1().ResourceClaims("default").ApplyStatus(t.Context(),
				resourcev1ac.ResourceClaim(claim.Name, "default").WithStatus(resourcev1ac.ResourceClaimStatus().WithDevices(
					resourcev1ac.AllocatedDeviceStatus().WithDriver("nic.example.com").WithPool("node-a").WithDevice("eth0").
						WithData(runtime.RawExtension{Raw: []byte(`{"mac":"x"}`)}))),
				metav1.ApplyOptions{FieldManager: "nic-driver"})
			if err != nil {
				t.Fatal(err)
			}
			claim = getClaim(t, cs, claim.Name)
			w.Record(claim, nodeDevices("gpu-0", "gpu-3"))
			waitIdle(t, w)

			got := getClaim(t, cs, claim.Name)
			byDevice := map[string]map[string]resourceapi.DeviceAttribute{}
			for _, d := range got.Status.Devices {
				if d.Driver != testDriver {
					byDevice[d.Driver+"/"+d.Device] = nil
					continue
				}
				var data map[string]resourceapi.DeviceAttribute
				if d.Data == nil || json.Unmarshal(d.Data.Raw, &data) != nil {
					t.Fatalf("device %s/%s: data %v is not a JSON object of DeviceAttribute", d.Driver, d.Device, d.Data)
				}
				byDevice[d.Driver+"/"+d.Device] = data
			}
			if _, ok := byDevice["nic.example.com/eth0"]; len(byDevice) != 3 || !ok {
				t.Fatalf("status.devices = %+v, want gpu-0, gpu-3 and the other driver's eth0", got.Status.Devices)
			}
			for i, dev := range []string{"gpu-0", "gpu-3"} {
				data := byDevice[testDriver+"/"+dev]
				if data["uuid"].StringValue == nil || *data["model"].StringValue != "LATEST-GPU-MODEL" ||
					*data["driverVersion"].VersionValue != "1.0.0" || *data["index"].IntValue != int64(i) {
					t.Errorf("%s: data %s", dev, mustJSON(data))
				}
			}
			owned := false
			for _, m := range got.ManagedFields {
				owned = owned || (m.Manager == testDriver+"/kubelet-plugin" && m.Subresource == "status")
			}
			if !owned {
				t.Errorf("no status field manager %s/kubelet-plugin in %+v", testDriver, got.ManagedFields)
			}

			if n := writes.n.Load(); n != 1 {
				t.Errorf("%d status writes, want 1", n)
			}
			// Prepared again (a kubelet restart): the claim shows the data, nothing is written.
			w.Record(got, nodeDevices("gpu-0", "gpu-3"))
			waitIdle(t, w)
			if n := writes.n.Load(); n != 1 {
				t.Errorf("same data written again: %d status writes", n)
			}
			if strings.Contains(logs.String(), "drops ResourceClaim status.devices") {
				t.Errorf("writer turned itself off on a server that keeps the field:\n%s", logs.String())
			}
		})
	}

	t.Run("claim replaced under the same name", func(t *testing.T) {
		w, logs, _ := startWriter(t, srv, "v1")
		old := allocated(t, cs, "replaced", "gpu-1")
		if err := cs.ResourceV1().ResourceClaims("default").Delete(t.Context(), old.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		current := allocated(t, cs, "replaced", "gpu-1")
		w.Record(old, nodeDevices("gpu-1"))
		waitIdle(t, w)
		if got := getClaim(t, cs, current.Name); len(got.Status.Devices) != 0 || got.UID != current.UID {
			t.Errorf("the old claim's status landed in its replacement: %+v", got.Status.Devices)
		}
		if !strings.Contains(logs.String(), "the API server refused the status") {
			t.Errorf("refusal not logged:\n%s", logs.String())
		}
	})

	t.Run("claim deallocated before the write", func(t *testing.T) {
		w, _, _ := startWriter(t, srv, "v1")
		claim := allocated(t, cs, "deallocated", "gpu-2")
		dealloc := claim.DeepCopy()
		dealloc.Status.Allocation = nil
		if _, err := cs.ResourceV1().ResourceClaims("default").UpdateStatus(t.Context(), dealloc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		w.Record(claim, nodeDevices("gpu-2"))
		waitIdle(t, w)
		if got := getClaim(t, cs, claim.Name); len(got.Status.Devices) != 0 {
			t.Errorf("status written into a deallocated claim: %+v", got.Status.Devices)
		}
	})

	t.Run("restart: resync writes what is missing", func(t *testing.T) {
		w, _, _ := startWriter(t, srv, "v1")
		claim := allocated(t, cs, "resync", "gpu-4", "gpu-5", "gpu-6", "gpu-7")
		w.Resync(claim.Namespace, claim.Name, claim.UID, nodeDevices("gpu-4", "gpu-5", "gpu-6", "gpu-7"))
		waitIdle(t, w)
		if got := getClaim(t, cs, claim.Name); len(got.Status.Devices) != 4 {
			t.Errorf("status.devices = %+v, want 4 entries", got.Status.Devices)
		}
	})
}

// A server with the field's gate off, as 1.32 (alpha) by default: the writer finds out from the
// answer to its first write, says so once and writes nothing more.
func TestAPIServerDropsDeviceStatus(t *testing.T) {
	srv := testapiserver.Start(t, testapiserver.WithRuntimeConfig(testapiserver.V1Beta1Only),
		testapiserver.WithFeatureGates("DRAResourceClaimDeviceStatus=false"))
	cs := srv.Clientset
	if v := srv.ServedResourceVersions(t); len(v) != 1 || v[0] != "v1beta1" {
		t.Fatalf("served %v", v)
	}
	w, logs, writes := startWriter(t, srv, "v1beta1")
	for i := range 3 {
		claim := allocated(t, cs, fmt.Sprintf("claim-%d", i), "gpu-0")
		w.Record(claim, nodeDevices("gpu-0"))
		waitIdle(t, w)
	}
	if n := writes.n.Load(); n != 1 {
		t.Errorf("%d status writes, want only the first", n)
	}
	const line = "The API server drops ResourceClaim status.devices"
	if n := strings.Count(logs.String(), line); n != 1 {
		t.Errorf("%q logged %d times, want once:\n%s", line, n, logs.String())
	}
	if !strings.Contains(logs.String(), `apiVersion="resource.k8s.io/v1beta1"`) {
		t.Errorf("the line does not name the served version:\n%s", logs.String())
	}
}

func mustJSON(v any) string {
	raw, _ := json.Marshal(v)
	return string(raw)
}
