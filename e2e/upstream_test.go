package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
	"github.com/gpu-dra/gpu-dra/internal/manifest"
)

// served is what the cluster's API server keeps of the DRA fields these demos exercise, found by
// round trips (never from the version string).
type served struct {
	// deviceStatus: a claim's status.devices survives a status update (KEP-4817; beta from 1.33).
	deviceStatus bool
	// adminAccess: a request's adminAccess survives a create (KEP-5018; beta from 1.34).
	adminAccess bool
}

// expected is what the product does on such a cluster.
type expected struct {
	// statusData: each prepared claim's status.devices[].data has uuid, model, index, driverVersion.
	statusData bool
	// droppedStatusLine: the plugin says once that the API server drops status.devices.
	droppedStatusLine bool
	// adminEnv is DRA_ADMIN_ACCESS in the admin-access demo's container.
	adminEnv string
	// adminBesideOthers: the admin-access pod gets all GPUs while other pods hold some; without
	// admin access its claim is an ordinary "all devices" claim and waits for them.
	adminBesideOthers bool
}

// expectations is every version-dependent answer in one place: 1.37 and 1.34 (both fields served
// and on by default), 1.32 with the seed's flags (both alpha and off: the API server drops them).
// The device metadata file needs no gate (library and CDI), so it is expected everywhere.
var expectations = map[served]expected{
	{deviceStatus: true, adminAccess: true}:   {statusData: true, adminEnv: "true", adminBesideOthers: true},
	{deviceStatus: false, adminAccess: false}: {droppedStatusLine: true, adminEnv: "false"},
}

const droppedStatusLine = "The API server drops ResourceClaim status.devices"

// TestUpstreamDemos runs the upstream reference driver's demos basic-resourceclaimtemplate and
// admin-access with only the image swapped (testdata/upstream) and checks what a user of the
// reference driver expects: distinct GPUs, DRA_ADMIN_ACCESS, every GPU for the admin, claims whose
// status says which GPU they got, and the device metadata file in the container.
func TestUpstreamDemos(t *testing.T) {
	c := framework.Setup(t)
	version := c.NewestResourceVersion(t)
	installForTest(t, c, version)

	has := probeServed(t, c)
	want, ok := expectations[has]
	if !ok {
		t.Fatalf("no expectations for a cluster that keeps %+v", has)
	}
	t.Logf("resource.k8s.io/%s; the API server keeps %+v; expecting %+v", version, has, want)
	// A plugin pod is ready before its slice is published.
	waitDevices(t, c, version, 8, "LATEST-GPU-MODEL")
	devices, err := driverDevices(c, version)
	if err != nil || len(devices) != 8 {
		t.Fatalf("published devices %v, %v", devices, err)
	}
	uuids := map[string]string{}
	for _, d := range devices {
		uuids[d.Name] = d.UUID
	}

	basicNS := "basic-resourceclaimtemplate"
	applyUpstream(t, c, "basic-resourceclaimtemplate", version, basicNS)
	t.Run("basic-resourceclaimtemplate", func(t *testing.T) {
		taken := map[string]string{}
		for _, pod := range []string{"pod0", "pod1"} {
			c.WaitForPodPhase(t, basicNS, pod, 2*time.Minute, corev1.PodRunning)
			env := c.GPUEnv(t, basicNS, pod)
			if len(env) != 1 {
				t.Fatalf("%s sees %q, want one GPU_DEVICE_<i>", pod, env)
			}
			_, dev, _ := strings.Cut(env[0], "=")
			if other, ok := taken[dev]; ok {
				t.Errorf("%s and %s both got %s", pod, other, dev)
			}
			taken[dev] = pod
			// The device metadata file, where a reader built with the library looks for it.
			path := metadata.ResourceClaimTemplateFilePath(driver, "gpu", "gpu")
			out := c.Kubectl(t, "-n", basicNS, "exec", pod, "--", "cat", path)
			var dm metadata.DeviceMetadata
			if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(strings.NewReader(out)), &dm); err != nil {
				t.Fatalf("%s: %s: %v\n%s", pod, path, err, out)
			}
			if dm.PodClaimName == nil || *dm.PodClaimName != "gpu" || len(dm.Requests) != 1 || len(dm.Requests[0].Devices) != 1 {
				t.Fatalf("%s: metadata %+v", pod, dm)
			}
			md := dm.Requests[0].Devices[0]
			if md.Name != dev || md.Driver != driver || md.Attributes["uuid"].StringValue == nil || *md.Attributes["uuid"].StringValue != uuids[dev] {
				t.Errorf("%s: metadata says %s/%s uuid %v, the pod has %s (uuid %s)", pod, md.Driver, md.Name, md.Attributes["uuid"].StringValue, dev, uuids[dev])
			}
		}
		checkClaimStatus(t, c, basicNS, want.statusData, uuids)
	})

	adminNS := "admin-access"
	applyUpstream(t, c, "admin-access", version, adminNS)
	t.Run("admin-access", func(t *testing.T) {
		if !want.adminBesideOthers {
			// An ordinary claim for all GPUs: it waits until the demo pods above let theirs go.
			waitForEvent(t, c, adminNS, "pod0", "FailedScheduling")
			c.Kubectl(t, "-n", basicNS, "delete", "pods", "--all", "--wait=true")
		}
		c.WaitForPodPhase(t, adminNS, "pod0", 2*time.Minute, corev1.PodRunning)
		var logs string
		framework.Eventually(t, time.Minute, "the demo's output", func() (bool, error) {
			var err error
			logs, err = c.KubectlErr("-n", adminNS, "logs", "pod0", "-c", "ctr0")
			return strings.Contains(logs, "=== Sleeping to allow inspection ==="), err
		})
		exported := exportedEnv(logs)
		if got := exported["DRA_ADMIN_ACCESS"]; got != want.adminEnv {
			t.Errorf("DRA_ADMIN_ACCESS=%q, want %q\n%s", got, want.adminEnv, logs)
		}
		if !strings.Contains(logs, "DRA Admin Access: "+want.adminEnv+"\n") {
			t.Errorf("the demo's own line is not \"DRA Admin Access: %s\":\n%s", want.adminEnv, logs)
		}
		var gpus []string
		for k, v := range exported {
			if regexp.MustCompile(`^GPU_DEVICE_[0-9]+$`).MatchString(k) {
				gpus = append(gpus, k+"="+v)
			}
		}
		sort.Strings(gpus)
		if len(gpus) != 8 {
			t.Errorf("admin container sees %d GPUs %v, want all 8", len(gpus), gpus)
		}
		checkClaimStatus(t, c, adminNS, want.statusData, uuids)
	})

	t.Run("plugin log about claim status", func(t *testing.T) {
		count := func() int {
			logs, _ := c.KubectlErr("-n", releaseNS, "logs", "-l", pluginSelector, "--tail=-1")
			return strings.Count(logs, droppedStatusLine)
		}
		if want.droppedStatusLine {
			framework.Eventually(t, 30*time.Second, "the plugin's line about status.devices", func() (bool, error) { return count() > 0, nil })
		}
		if n, w := count(), map[bool]int{true: 1, false: 0}[want.droppedStatusLine]; n != w {
			t.Errorf("the plugin logged %q %d times, want %d", droppedStatusLine, n, w)
		}
	})
}

// applyUpstream applies an upstream demo in the form the cluster serves: as it is where v1 is
// served, else converted as `kubectl dra upgrade --to <version>` does. It deletes the demo's
// namespace afterwards.
func applyUpstream(t *testing.T, c *framework.Cluster, name, version, namespace string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "upstream", name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if version != "v1" {
		if data, _, err = manifest.Rewrite(data, version); err != nil {
			t.Fatalf("convert %s to %s: %v", name, version, err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.KubectlErr("-n", namespace, "get", "pods,resourceclaims,events", "-o", "wide")
			t.Logf("namespace %s at failure:\n%s", namespace, out)
		}
		_, _ = c.KubectlErr("delete", "namespace", namespace, "--wait=true", "--timeout=2m")
	})
	c.ApplyManifest(t, data, olderFieldsDropped(version)...)
}

// exportedEnv reads the variables a shell's `export` listed: bash's `declare -x K="v"` or busybox
// sh's `export K='v'`.
func exportedEnv(logs string) map[string]string {
	line := regexp.MustCompile(`^(?:declare -x|export) ([A-Za-z_][A-Za-z0-9_]*)=(?:"(.*)"|'(.*)')$`)
	out := map[string]string{}
	for _, l := range strings.Split(logs, "\n") {
		if m := line.FindStringSubmatch(l); m != nil {
			out[m[1]] = m[2] + m[3]
		}
	}
	return out
}

// checkClaimStatus checks every claim in ns: with statusData, status.devices names each of its
// devices with a JSON object of DeviceAttribute values (as the upstream e2e reads it) matching the
// published device; without, no entry of this driver.
func checkClaimStatus(t *testing.T, c *framework.Cluster, ns string, statusData bool, uuids map[string]string) {
	t.Helper()
	claims := draclient.New(c.Clientset).ResourceClaims(ns)
	var list *resourceapi.ResourceClaimList
	framework.Eventually(t, 30*time.Second, "claim status in "+ns, func() (bool, error) {
		var err error
		if list, err = claims.List(context.Background(), metav1.ListOptions{}); err != nil {
			return false, err
		}
		for _, claim := range list.Items {
			if claim.Status.Allocation == nil || (statusData && len(claim.Status.Devices) != len(claim.Status.Allocation.Devices.Results)) {
				return false, nil
			}
		}
		return len(list.Items) > 0, nil
	})
	for _, claim := range list.Items {
		if !statusData {
			if len(claim.Status.Devices) != 0 {
				t.Errorf("claim %s: status.devices %+v on a cluster that drops the field", claim.Name, claim.Status.Devices)
			}
			continue
		}
		for i, d := range claim.Status.Devices {
			if i == 0 {
				t.Logf("claim %s/%s: status.devices[0] %s/%s/%s data %s", ns, claim.Name, d.Driver, d.Pool, d.Device, d.Data.Raw)
			}
			var data map[string]resourceapi.DeviceAttribute
			if d.Data == nil || json.Unmarshal(d.Data.Raw, &data) != nil {
				t.Errorf("claim %s device %s: data %v is not a JSON object of DeviceAttribute", claim.Name, d.Device, d.Data)
				continue
			}
			index := fmt.Sprint(ptr.Deref(data["index"].IntValue, -1))
			if d.Driver != driver || ptr.Deref(data["uuid"].StringValue, "") != uuids[d.Device] || "gpu-"+index != d.Device ||
				ptr.Deref(data["model"].StringValue, "") != "LATEST-GPU-MODEL" || ptr.Deref(data["driverVersion"].VersionValue, "") != "1.0.0" {
				t.Errorf("claim %s: status.devices entry %s/%s/%s data %s", claim.Name, d.Driver, d.Pool, d.Device, d.Data.Raw)
			}
		}
	}
}

// probeServed finds out by dry runs what the API server keeps: a claim created with adminAccess
// in a namespace labelled for it, and status.devices in a status update of an allocated claim.
func probeServed(t *testing.T, c *framework.Cluster) served {
	t.Helper()
	ctx := context.Background()
	ns := c.Namespace(t, "probe")
	c.Kubectl(t, "label", "namespace", ns, resourceapi.DRAAdminNamespaceLabelKey+"=true")
	claims := draclient.New(c.Clientset).ResourceClaims(ns)
	claim := func(admin *bool) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "probe"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "gpu",
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driver, AllocationMode: resourceapi.DeviceAllocationModeExactCount,
					Count: 1, AdminAccess: admin},
			}}}},
		}
	}
	var has served
	dry, err := claims.Create(ctx, claim(ptr.To(true)), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatalf("dry-run create of a claim with adminAccess: %v", err)
	}
	has.adminAccess = ptr.Deref(dry.Spec.Devices.Requests[0].Exactly.AdminAccess, false)

	created, err := claims.Create(ctx, claim(nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := claims.Delete(ctx, created.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	}()
	created.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: driver, Pool: "probe", Device: "gpu-0"}},
	}}
	created.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: driver, Pool: "probe", Device: "gpu-0",
		Data: &runtime.RawExtension{Raw: []byte(`{"probe":true}`)}}}
	updated, err := claims.UpdateStatus(ctx, created, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatalf("dry-run status update with status.devices: %v", err)
	}
	has.deviceStatus = len(updated.Status.Devices) == 1 && bytes.Contains(updated.Status.Devices[0].Data.Raw, []byte("probe"))
	return has
}

// waitForEvent waits for an event of the given reason about the pod.
func waitForEvent(t *testing.T, c *framework.Cluster, ns, pod, reason string) {
	t.Helper()
	framework.Eventually(t, time.Minute, fmt.Sprintf("event %s for %s/%s", reason, ns, pod), func() (bool, error) {
		events, err := c.Clientset.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + pod + ",reason=" + reason,
		})
		return err == nil && len(events.Items) > 0, err
	})
}
