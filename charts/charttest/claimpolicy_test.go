package charttest

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/driver/devicestatus"
	"github.com/gpu-dra/gpu-dra/hack/buildenv"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

const (
	claimPolicy    = "ValidatingAdmissionPolicy 'gpu-dra-kubelet-plugin-claim-status'"
	claimNamespace = "claims"
	otherDriver    = "nic.example.com"
)

// claimPolicyReleases are the releases the claim status policy is proven on, each serving every
// resource.k8s.io version it knows: the oldest supported (status.devices alpha there, so the gate is
// on, as on a cluster that uses it), one without the upstream per-node check and the newest, where
// DRAResourceClaimGranularStatusAuthorization (beta from 1.36, on by default) refuses most of the
// same writes before admission.
var claimPolicyReleases = []struct {
	release, runtimeConfig, featureGates string
	upstreamCheck                        bool
}{
	{buildenv.Oldest, "resource.k8s.io/v1beta1=true", "DynamicResourceAllocation=true,DRAResourceClaimDeviceStatus=true", false},
	{buildenv.Seed, testapiserver.AllVersions, "", false},
	{buildenv.Newest, testapiserver.AllVersions, "", true},
}

// TestClaimStatusPolicy installs the plugin's RBAC and admission policies on a real API server of
// each release and acts as the plugin of node-a (its service account with a pod-bound token's node
// claim), in every served resource.k8s.io version: the plugin's own device status write lands,
// every other change of a claim's status is refused.
func TestClaimStatusPolicy(t *testing.T) {
	for _, rel := range claimPolicyReleases {
		t.Run(rel.release, func(t *testing.T) {
			dir := testapiserver.ReleaseAssetsDir(t, rel.release)
			if minor := testapiserver.MinorOf(t, dir); !strings.HasPrefix(rel.release, minor+".") {
				t.Fatalf("%s holds kube-apiserver %s, not %s", dir, minor, rel.release)
			}
			srv := testapiserver.Start(t, testapiserver.WithAssetsDir(dir),
				testapiserver.WithRuntimeConfig(rel.runtimeConfig), testapiserver.WithFeatureGates(rel.featureGates))
			installPluginRights(t, srv, "v"+rel.release)
			for _, version := range srv.ServedResourceVersions(t) {
				t.Run(version, func(t *testing.T) {
					testClaimStatusPolicy(t, srv, version, rel.upstreamCheck)
				})
			}
		})
	}
}

// installPluginRights creates what the chart renders for the plugin's identity: its service
// account, RBAC and admission policies.
func installPluginRights(t *testing.T, srv *testapiserver.Server, kubeVersion string) {
	t.Helper()
	var c cluster
	for _, cl := range clusters {
		if cl.kubeVersion == kubeVersion {
			c = cl
		}
	}
	if c.name == "" {
		t.Fatalf("no cluster %s in clusters", kubeVersion)
	}
	r := mustRender(t, servedCapabilities(t, c, srv.ServedResourceVersions(t)), values(t, installSets...))
	var plugin []manifest
	for _, m := range r.Manifests {
		if strings.HasSuffix(m.Source, "/kubeletplugin-rbac.yaml") || strings.HasSuffix(m.Source, "/kubeletplugin-admissionpolicy.yaml") {
			plugin = append(plugin, m)
		}
	}
	ctx := t.Context()
	for _, ns := range []string{releaseNS, claimNamespace} {
		if _, err := srv.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	newApplier(t, srv.Config).create(plugin)
	if t.Failed() {
		t.FailNow()
	}
}

// refusal is a write the plugin must not make. policy is what the policy's denial says; empty
// where the API server's own validation refuses the write first on every release. onlyPolicy
// marks a write that no upstream check refuses on any release, 1.36+ included.
type refusal struct {
	name       string
	do         func() error
	policy     string
	onlyPolicy bool
}

func testClaimStatusPolicy(t *testing.T, srv *testapiserver.Server, version string, upstreamCheck bool) {
	ctx := t.Context()
	gvr := resourceapi.SchemeGroupVersion.WithResource("resourceclaims")
	gvr.Version = version
	admin := dynamic.NewForConfigOrDie(srv.Config).Resource(gvr).Namespace(claimNamespace)
	plugin := impersonate(srv.Config, "gpu-dra-kubelet-plugin", map[string][]string{nodeClaim: {"node-a"}})
	asPlugin := dynamic.NewForConfigOrDie(plugin).Resource(gvr).Namespace(claimNamespace)
	noClaim := dynamic.NewForConfigOrDie(impersonate(srv.Config, "gpu-dra-kubelet-plugin", nil)).Resource(gvr).Namespace(claimNamespace)

	mac := map[string]any{"mac": "02:00:00:00:00:01"}
	mine := allocatedClaim(t, admin, version, "mine-"+version, "node-a", 1, mac)
	theirs := allocatedClaim(t, admin, version, "theirs-"+version, "node-b", 1, mac)
	pending := newClaim(t, admin, version, "pending-"+version)

	jsonPatch := func(c dynamic.ResourceInterface, name string, ops ...map[string]any) func() error {
		return func() error {
			data, err := json.Marshal(ops)
			if err != nil {
				return err
			}
			_, err = c.Patch(ctx, name, types.JSONPatchType, data, metav1.PatchOptions{}, "status")
			return err
		}
	}
	op := func(kind, path string, value any) map[string]any {
		return map[string]any{"op": kind, "path": path, "value": value}
	}
	// The other driver's entry is the first: a JSON patch that finds another there fails instead.
	isOther := op("test", "/status/devices/0/driver", otherDriver)
	ourEntry := func(node, device string) map[string]any {
		return map[string]any{"driver": "gpu.example.com", "pool": node, "device": device, "data": map[string]any{"uuid": map[string]any{"string": "forged"}}}
	}
	applyOurEntry := func(c dynamic.ResourceInterface, claim *unstructured.Unstructured, node string) func() error {
		return func() error {
			obj := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": claim.GetAPIVersion(), "kind": "ResourceClaim",
				"metadata": map[string]any{"name": claim.GetName(), "namespace": claimNamespace},
				"status":   map[string]any{"devices": []any{ourEntry(node, "gpu-0")}},
			}}
			_, err := c.ApplyStatus(ctx, claim.GetName(), obj, metav1.ApplyOptions{FieldManager: "gpu.example.com/kubelet-plugin", Force: true})
			return err
		}
	}

	// Policies take effect asynchronously. An unchanged status of another node's claim is what no
	// upstream check refuses, on any release.
	probe := refusal{"write another node's claim, changing nothing", jsonPatch(asPlugin, theirs.GetName()), "claim " + theirs.GetName() + " is not", true}
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		last = probe.do()
		return last != nil, nil
	}); err != nil {
		t.Errorf("the plugin on node-a may write the status of a claim allocated to node-b: %v", err)
	}

	refusals := []refusal{
		probe,
		{"clear reservedFor", jsonPatch(asPlugin, mine.GetName(), op("remove", "/status/reservedFor", nil)),
			"may change only the status.devices entries of driver gpu.example.com in a claim, not status.reservedFor", false},
		{"deallocate (clear allocation and reservedFor)", jsonPatch(asPlugin, mine.GetName(),
			op("remove", "/status/reservedFor", nil), op("remove", "/status/allocation", nil)), "status.allocation", false},
		{"change the allocated device", jsonPatch(asPlugin, mine.GetName(),
			op("replace", "/status/allocation/devices/results/0/device", "gpu-1")), "", false},
		{"allocate a pending claim to its own device", jsonPatch(asPlugin, pending.GetName(),
			op("add", "/status/allocation", allocation("node-a", 1))), "claim " + pending.GetName() + " is not", false},
		{"change another driver's entry", jsonPatch(asPlugin, mine.GetName(), isOther,
			op("replace", "/status/devices/0/data", map[string]any{"mac": "forged"})), "not those of nic.example.com (pool node-a, device eth0)", false},
		{"remove another driver's entry", jsonPatch(asPlugin, mine.GetName(), isOther,
			op("remove", "/status/devices/0", nil)), "not those of nic.example.com", false},
		{"write its driver's entry on another node's claim", applyOurEntry(asPlugin, theirs, "node-b"), "claim " + theirs.GetName() + " is not", false},
		{"record a device the claim was not allocated", jsonPatch(asPlugin, mine.GetName(),
			op("add", "/status/devices/-", ourEntry("node-a", "gpu-7"))), "", false},
		{"write without a node claim", applyOurEntry(noClaim, mine, "node-a"), "authentication.kubernetes.io/node-name claim", false},
	}
	checkRefusals(t, refusals, upstreamCheck)

	// What the plugin does after a prepare, through its own code, on that claim and on the largest
	// a claim can be: 32 devices, 16 of them with another driver's entry of the most data allowed.
	recordAsPlugin(t, srv, admin, plugin, version, mine)
	largest := allocatedClaim(t, admin, version, "largest-"+version, "node-a", 16, map[string]any{"blob": strings.Repeat("x", 10200)})
	recordAsPlugin(t, srv, admin, plugin, version, largest)

	// Anyone else (the scheduler, the claim controller) is not restricted.
	if err := func() error {
		_, err := admin.Patch(ctx, mine.GetName(), types.JSONPatchType, []byte(`[{"op":"remove","path":"/status/reservedFor"}]`),
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}, "status")
		return err
	}(); err != nil {
		t.Errorf("the policy restricts other users: %v", err)
	}
}

// checkRefusals makes each write and checks who refuses it: on releases with the upstream per-node
// check (upstreamCheck) either may; before, the policy, with its message, or the API server's own
// validation where the case says so.
func checkRefusals(t *testing.T, refusals []refusal, upstreamCheck bool) {
	t.Helper()
	for _, r := range refusals {
		err := r.do()
		by := "the admission policy"
		if err != nil && !strings.Contains(err.Error(), claimPolicy) {
			by = "the API server's own checks"
		}
		switch {
		case err == nil:
			t.Errorf("the plugin on node-a may %s", r.name)
			continue
		case !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err):
			t.Errorf("%s: %v, want forbidden or invalid", r.name, err)
		case upstreamCheck && !r.onlyPolicy:
			// Either may refuse; the upstream check runs before admission.
		case r.policy == "":
			if by != "the API server's own checks" {
				t.Errorf("%s: %v, want the API server's validation to refuse it", r.name, err)
			}
		case !strings.Contains(err.Error(), claimPolicy) || !strings.Contains(err.Error(), r.policy):
			t.Errorf("%s: %v, want the policy's denial saying %q", r.name, err, r.policy)
		}
		t.Logf("refused by %s: %s (%v)", by, r.name, err)
	}
}

func newClaim(t *testing.T, admin dynamic.ResourceInterface, version, name string) *unstructured.Unstructured {
	t.Helper()
	request := map[string]any{"name": "gpu", "exactly": map[string]any{"deviceClassName": "gpu.example.com"}}
	if version == "v1beta1" {
		request = map[string]any{"name": "gpu", "deviceClassName": "gpu.example.com"}
	}
	claim, err := admin.Create(t.Context(), &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "resource.k8s.io/" + version, "kind": "ResourceClaim",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"devices": map[string]any{"requests": []any{request}}},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create claim %s: %v", name, err)
	}
	return claim
}

// allocation is what the scheduler writes for n GPUs of node and n devices of another driver there.
func allocation(node string, n int) map[string]any {
	var results []any
	for i := range n {
		results = append(results,
			map[string]any{"request": "gpu", "driver": "gpu.example.com", "pool": node, "device": fmt.Sprintf("gpu-%d", i)},
			map[string]any{"request": "gpu", "driver": otherDriver, "pool": node, "device": fmt.Sprintf("eth%d", i)})
	}
	return map[string]any{
		"devices": map[string]any{"results": results},
		"nodeSelector": map[string]any{"nodeSelectorTerms": []any{map[string]any{"matchFields": []any{
			map[string]any{"key": "metadata.name", "operator": "In", "values": []any{node}},
		}}}},
	}
}

// allocatedClaim is a claim allocated on node (n devices of each driver), reserved for a pod, with
// the other driver's entries in status.devices, as the scheduler and that driver's plugin leave it.
func allocatedClaim(t *testing.T, admin dynamic.ResourceInterface, version, name, node string, n int, data map[string]any) *unstructured.Unstructured {
	t.Helper()
	claim := newClaim(t, admin, version, name)
	var devices []any
	for i := range n {
		devices = append(devices, map[string]any{"driver": otherDriver, "pool": node, "device": fmt.Sprintf("eth%d", i), "data": data})
	}
	claim.Object["status"] = map[string]any{
		"allocation":  allocation(node, n),
		"reservedFor": []any{map[string]any{"resource": "pods", "name": "consumer", "uid": "2d9b5a4c-0d5c-4c1e-9d59-8f3f1b2f7a10"}},
		"devices":     devices,
	}
	claim, err := admin.UpdateStatus(t.Context(), claim, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("allocate claim %s: %v", name, err)
	}
	if got, _, _ := unstructured.NestedSlice(claim.Object, "status", "devices"); len(got) != n {
		t.Fatalf("claim %s: the server dropped status.devices (feature gate DRAResourceClaimDeviceStatus off?): %v", name, claim.Object["status"])
	}
	return claim
}

// recordAsPlugin records every GPU of the claim as the plugin's device status writer does after a
// prepare, as the plugin (config plugin), and checks that it landed and that nothing else changed.
func recordAsPlugin(t *testing.T, srv *testapiserver.Server, admin dynamic.ResourceInterface, plugin *rest.Config, version string, before *unstructured.Unstructured) {
	t.Helper()
	ctx := t.Context()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	w, err := devicestatus.New(kubernetes.NewForConfigOrDie(plugin), "gpu.example.com", version, devicestatus.WithRetry(1, time.Millisecond, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	stop := w.Start(klog.NewContext(ctx, logger))
	defer stop()
	claim, err := draclient.New(srv.Clientset).ResourceClaims(claimNamespace).Get(ctx, before.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var gpus []devicestatus.Device
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == "gpu.example.com" {
			gpus = append(gpus, devicestatus.Device{Pool: r.Pool, Name: r.Device, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"uuid": {StringValue: ptr.To(r.Device + "-uuid")}, "model": {StringValue: ptr.To("LATEST-GPU-MODEL")},
			}})
		}
	}
	w.Record(claim, gpus)
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return w.Pending() == 0, nil
	}); err != nil {
		t.Fatalf("claim %s: the plugin's device status write never finished", before.GetName())
	}
	if logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String(); strings.Contains(logs, "not written") {
		t.Errorf("claim %s: the plugin's own device status write was refused:\n%s", before.GetName(), logs)
	}

	after, err := admin.Get(ctx, before.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, want := after.Object["status"].(map[string]any), before.Object["status"].(map[string]any)
	var ours, others []any
	devices, _ := got["devices"].([]any)
	for _, d := range devices {
		if d.(map[string]any)["driver"] == "gpu.example.com" {
			ours = append(ours, d)
		} else {
			others = append(others, d)
		}
	}
	if len(ours) != len(gpus) {
		t.Errorf("claim %s: %d entries of the plugin's driver, want %d", before.GetName(), len(ours), len(gpus))
	}
	if !reflect.DeepEqual(others, want["devices"]) {
		t.Errorf("claim %s: the other driver's entries changed:\nbefore %v\nafter  %v", before.GetName(), want["devices"], others)
	}
	for _, field := range []string{"allocation", "reservedFor"} {
		if !reflect.DeepEqual(got[field], want[field]) {
			t.Errorf("claim %s: status.%s changed:\nbefore %v\nafter  %v", before.GetName(), field, want[field], got[field])
		}
	}
}
