package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

const (
	cfgHead      = `"apiVersion":"gpu.resource.example.com/v1alpha1","kind":"GpuConfig"`
	cfgLong      = `{` + cfgHead + `,"sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`
	cfgPartition = `{` + cfgHead + `,"sharing":{"strategy":"SpacePartitioning","spacePartitioningConfig":{"partitionCount":4}}}`
	cfgBad       = `{` + cfgHead + `,"sharing":{"strategy":"SpacePartitioning","spacePartitioningConfig":{"partitionCount":-1}}}`
)

// TestPlugin runs the plugin binary against an API server serving only v1 (1.36+) and one serving
// only v1beta1 (1.32), drives it like the kubelet of that generation, and checks publishing,
// prepare/unprepare, CDI files, health, metrics, and that a restart leaves the slices as they are.
func TestPlugin(t *testing.T) {
	for _, tc := range []struct {
		name, runtimeConfig, sliceVersion string
		kubeletV1beta1                    bool
	}{
		{name: "v1 only, kubelet 1.34+", runtimeConfig: v1Only, sliceVersion: "v1"},
		{name: "v1beta1 only, kubelet 1.32", runtimeConfig: testapiserver.V1Beta1Only, sliceVersion: "v1beta1", kubeletV1beta1: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			c := newCluster(t, tc.runtimeConfig, nil)
			served := c.srv.ServedResourceVersions(t)
			if !slices.Equal(served, []string{tc.sliceVersion}) {
				t.Fatalf("server serves resource.k8s.io %v, test needs only %s", served, tc.sliceVersion)
			}
			p := c.startPlugin(t, "")
			k := p.register(ctx, tc.kubeletV1beta1)

			devices := waitForSlices(t, ctx, c, tc.sliceVersion, 8)
			checkSeedDevices(t, c.node, devices)

			code, body, err := p.get("/healthz", p.healthAddr)
			if err != nil || code != 200 {
				t.Errorf("/healthz = %d %q %v", code, body, err)
			}

			one := c.allocatedClaim(t, ctx, "one", []string{"gpu-0"})
			two := c.allocatedClaim(t, ctx, "two", []string{"gpu-1", "gpu-2"}, "class:"+cfgLong, cfgPartition)
			classOnly := c.allocatedClaim(t, ctx, "class-only", []string{"gpu-3"}, "class:"+cfgLong)
			got, err := k.prepare(ctx, one, two, classOnly)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]map[string][]string{
				"one":        {"GPU_DEVICE_0": {"gpu-0", "TimeSlicing", "Default", ""}},
				"two":        {"GPU_DEVICE_1": {"gpu-1", "SpacePartitioning", "", "4"}, "GPU_DEVICE_2": {"gpu-2", "SpacePartitioning", "", "4"}},
				"class-only": {"GPU_DEVICE_3": {"gpu-3", "TimeSlicing", "Long", ""}},
			}
			for _, claim := range []*resourceapi.ResourceClaim{one, two, classOnly} {
				checkCDI(t, c, claim, got[claim.UID], want[claim.Name])
			}

			again, err := k.prepare(ctx, two)
			if err != nil || !reflect.DeepEqual(again[two.UID], got[two.UID]) {
				t.Errorf("second prepare = %v, %v; want %v", again, err, got[two.UID])
			}

			bad := c.allocatedClaim(t, ctx, "bad", []string{"gpu-4"}, cfgBad)
			if _, err := k.prepare(ctx, bad); err == nil || !strings.Contains(err.Error(), "spacePartitioningConfig.partitionCount") {
				t.Errorf("prepare with bad config = %v, want an error naming partitionCount", err)
			}

			if err := k.unprepare(ctx, one); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(specPath(c, one)); !os.IsNotExist(err) {
				t.Errorf("spec of unprepared claim: %v", err)
			}
			if entries := c.consistent(t); len(entries) != 2 {
				t.Errorf("checkpoint holds %d claims, want 2", len(entries))
			}

			metrics := scrape(t, p)
			for _, m := range []string{
				`gpu_dra_plugin_prepare_claims_total{result="success"} 4`,
				`gpu_dra_plugin_prepare_claims_total{result="error"} 1`,
				`gpu_dra_plugin_unprepare_claims_total{result="success"} 1`,
				`gpu_dra_plugin_prepared_claims 2`,
				`gpu_dra_plugin_prepare_duration_seconds_count`,
			} {
				if !strings.Contains(metrics, m) {
					t.Errorf("/metrics lacks %q", m)
				}
			}
			if strings.Contains(metrics, `component="publish_dropped_fields"`) {
				t.Errorf("the API server dropped fields of our slices:\n%s", metrics)
			}

			// SIGTERM without a successor (liveness kill, deleted or evicted pod): the node's GPUs
			// stay published, and the next instance finds its slice as it wants it.
			before := c.sliceVersions(t, ctx, tc.sliceVersion)
			p.terminate()
			if after := c.sliceVersions(t, ctx, tc.sliceVersion); !slices.Equal(after, before) || len(after) != 1 {
				t.Errorf("after SIGTERM slices are %v, before %v; want them untouched", after, before)
			}
			p = c.startPlugin(t, "")
			p.register(ctx, tc.kubeletV1beta1)
			time.Sleep(time.Second)
			if after := c.sliceVersions(t, ctx, tc.sliceVersion); !slices.Equal(after, before) {
				t.Errorf("after a restart slices are %v, before %v; want them untouched", after, before)
			}
		})
	}
}

func waitForSlices(t *testing.T, ctx context.Context, c *cluster, version string, want int) []resourceapi.Device {
	t.Helper()
	var devices []resourceapi.Device
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		devices, _, lastErr = c.slices(ctx, version)
		return lastErr == nil && len(devices) == want, nil
	})
	if err != nil {
		t.Fatalf("waiting for %d devices in %s ResourceSlices: got %d, %v %v", want, version, len(devices), lastErr, err)
	}
	return devices
}

// checkSeedDevices compares with what the seed's example driver publishes.
func checkSeedDevices(t *testing.T, node string, devices []resourceapi.Device) {
	t.Helper()
	byName := map[string]resourceapi.Device{}
	for _, d := range devices {
		byName[d.Name] = d
	}
	for i := 0; i < 8; i++ {
		d, ok := byName[fmt.Sprintf("gpu-%d", i)]
		if !ok {
			t.Errorf("device gpu-%d not published: %v", i, devices)
			continue
		}
		a := d.Attributes
		if a["index"].IntValue == nil || *a["index"].IntValue != int64(i) ||
			a["model"].StringValue == nil || *a["model"].StringValue != "LATEST-GPU-MODEL" ||
			a["driverVersion"].VersionValue == nil || *a["driverVersion"].VersionValue != "1.0.0" ||
			a["uuid"].StringValue == nil || *a["uuid"].StringValue != simulated.DeviceUUID(node, i) {
			t.Errorf("gpu-%d attributes %+v", i, a)
		}
		if m := d.Capacity["memory"].Value; m.String() != "80Gi" {
			t.Errorf("gpu-%d memory %s", i, m.String())
		}
	}
}

func specPath(c *cluster, claim *resourceapi.ResourceClaim) string {
	return filepath.Join(c.cdiRoot, "k8s.gpu.example.com-gpu_"+string(claim.UID)+".json")
}

// checkCDI reads the claim's spec as a container runtime would and checks the returned device IDs
// resolve to devices whose env carries the expected values: device name, strategy, interval,
// partition count.
func checkCDI(t *testing.T, c *cluster, claim *resourceapi.ResourceClaim, got prepared, want map[string][]string) {
	t.Helper()
	spec, err := cdiapi.ReadSpec(specPath(c, claim), 0)
	if err != nil {
		t.Fatalf("claim %s: %v", claim.Name, err)
	}
	env := map[string]string{}
	for device, ids := range got {
		// The device's own ID first; the first device of each request also carries the ID of the
		// claim's device metadata (TestDeviceMetadata).
		if len(ids) == 0 || len(ids) > 2 || (len(ids) == 2 && !strings.HasPrefix(ids[1], driverName+"/metadata="+string(claim.UID)+"_")) {
			t.Fatalf("claim %s device %s: CDI IDs %v", claim.Name, device, ids)
		}
		kind, name, ok := strings.Cut(ids[0], "=")
		if !ok || kind != "k8s.gpu.example.com/gpu" {
			t.Fatalf("CDI ID %q", ids[0])
		}
		d := spec.GetDevice(name)
		if d == nil {
			t.Fatalf("claim %s: spec has no device %s", claim.Name, name)
		}
		for _, e := range d.ContainerEdits.Env {
			k, v, _ := strings.Cut(e, "=")
			env[k] = v
		}
	}
	if len(got) != len(want) {
		t.Errorf("claim %s: %d devices prepared, want %d", claim.Name, len(got), len(want))
	}
	for prefix, w := range want {
		gotVals := []string{env[prefix], env[prefix+"_SHARING_STRATEGY"], env[prefix+"_TIMESLICE_INTERVAL"], env[prefix+"_PARTITION_COUNT"]}
		if !slices.Equal(gotVals, w) {
			t.Errorf("claim %s %s = %v, want %v", claim.Name, prefix, gotVals, w)
		}
		if env[prefix+"_RESOURCE_CLAIM"] != string(claim.UID) {
			t.Errorf("claim %s %s_RESOURCE_CLAIM = %q", claim.Name, prefix, env[prefix+"_RESOURCE_CLAIM"])
		}
	}
}

func scrape(t testing.TB, p *plugin) string {
	t.Helper()
	code, body, err := p.get("/metrics", p.metricAddr)
	if err != nil || code != 200 {
		t.Fatalf("/metrics: %d %v", code, err)
	}
	return body
}

// TestCrashSafety SIGKILLs the plugin between and during prepares and unprepares and checks after
// each restart that nothing is lost or duplicated: CDI specs == checkpoint entries, and every claim
// the kubelet saw prepared prepares again to the same devices.
func TestCrashSafety(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := newCluster(t, v1Only, nil)
	const n = 24
	claims := make([]*resourceapi.ResourceClaim, n)
	for i := range claims {
		claims[i] = c.allocatedClaim(t, ctx, fmt.Sprintf("claim-%d", i), []string{fmt.Sprintf("gpu-%d", i)})
	}
	seen := map[string]prepared{} // claim name -> what the kubelet was told
	inv := c.nodeGroups(t, 32)

	p := c.startPlugin(t, "", inv)
	k := p.register(ctx, false)
	// Between prepares: a batch is done, then the process dies.
	for _, claim := range claims[:6] {
		res, err := k.prepare(ctx, claim)
		if err != nil {
			t.Fatal(err)
		}
		seen[claim.Name] = res[claim.UID]
	}
	p.kill()

	// During prepares and unprepares: a kubelet keeps calling while the process is killed at a
	// different moment each round.
	for round := 0; round < 6; round++ {
		p = c.startPlugin(t, "", inv)
		k = p.register(ctx, false)
		c.consistent(t)
		for name, before := range seen {
			claim := claimByName(claims, name)
			res, err := k.prepare(ctx, claim)
			if err != nil || !reflect.DeepEqual(res[claim.UID], before) {
				t.Fatalf("round %d: re-prepare %s = %v, %v; kubelet was told %v", round, name, res[claim.UID], err, before)
			}
		}
		// Let a few calls complete, then kill at a different point of the next ones each round.
		p.killDuring(round+1, time.Duration(round*400)*time.Microsecond, func(progress func()) {
			for i := 6; i < n; i++ {
				claim := claims[i]
				if round%2 == 1 && i%3 == 0 {
					if err := k.unprepare(ctx, claim); err != nil {
						return // the plugin died
					}
					delete(seen, claim.Name)
					progress()
					continue
				}
				res, err := k.prepare(ctx, claim)
				if err != nil {
					return
				}
				seen[claim.Name] = res[claim.UID]
				progress()
			}
		})
		t.Logf("round %d: killed with %d claims prepared as far as the kubelet knows", round, len(seen))
	}

	p = c.startPlugin(t, "", inv)
	k = p.register(ctx, false)
	entries := c.consistent(t)
	for name := range seen {
		if _, ok := entries[claimByName(claims, name).UID]; !ok {
			t.Errorf("claim %s was reported prepared but is not in the checkpoint", name)
		}
	}
	all, err := k.prepare(ctx, claims...)
	if err != nil {
		t.Fatal(err)
	}
	for name, before := range seen {
		if got := all[claimByName(claims, name).UID]; !reflect.DeepEqual(got, before) {
			t.Errorf("claim %s prepares to %v, kubelet was told %v", name, got, before)
		}
	}
	if entries := c.consistent(t); len(entries) != n {
		t.Errorf("%d claims prepared, want %d", len(entries), n)
	}

	// Claims deleted or replaced while the plugin was down are unprepared on start.
	p.kill()
	if err := c.claims.ResourceClaims(namespace).Delete(ctx, claims[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.claims.ResourceClaims(namespace).Delete(ctx, claims[1].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	replaced := c.allocatedClaim(t, ctx, claims[1].Name, []string{"gpu-1"})
	// A corrupt checkpoint on top: it must be moved aside and the state rebuilt from the specs.
	store := filepath.Join(c.dataDir(), "checkpoint.json")
	raw, _ := os.ReadFile(store)
	if err := os.WriteFile(store, raw[:len(raw)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	p = c.startPlugin(t, "", inv)
	k = p.register(ctx, false)
	entries = c.consistent(t)
	if len(entries) != n-2 {
		t.Errorf("after restart %d claims prepared, want %d", len(entries), n-2)
	}
	for _, gone := range []*resourceapi.ResourceClaim{claims[0], claims[1]} {
		if _, ok := entries[gone.UID]; ok {
			t.Errorf("claim %s (uid %s) no longer exists but is still prepared", gone.Name, gone.UID)
		}
	}
	if moved, _ := filepath.Glob(store + ".corrupt-*"); len(moved) != 1 {
		t.Errorf("corrupt checkpoint not moved aside: %v", moved)
	}
	logs, _ := os.ReadFile(p.log)
	if !strings.Contains(string(logs), "Checkpoint is corrupt") || !strings.Contains(string(logs), store) {
		t.Error("corrupt checkpoint not reported with its path in the log")
	}
	// The replaced claim got the device of the deleted one; the plugin released it on start.
	if _, err := k.prepare(ctx, replaced); err != nil {
		t.Fatal(err)
	}
	if err := k.unprepare(ctx, claims...); err != nil {
		t.Fatal(err)
	}
	if err := k.unprepare(ctx, replaced); err != nil {
		t.Fatal(err)
	}
	if entries := c.consistent(t); len(entries) != 0 {
		t.Errorf("after unprepare of all: %d entries", len(entries))
	}
}

func claimByName(claims []*resourceapi.ResourceClaim, name string) *resourceapi.ResourceClaim {
	for _, c := range claims {
		if c.Name == name {
			return c
		}
	}
	panic("no claim " + name)
}

// TestRollingUpdate runs two instances side by side as a DaemonSet rolling update with maxSurge
// does: the successor takes over the claims and the slices, which nobody rewrites.
func TestRollingUpdate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := newCluster(t, v1Only, map[string]string{"gpu.example.com/group": "small"})
	inv := filepath.Join(filepath.Dir(c.kubeconfig), "inventory.yaml")
	if err := os.WriteFile(inv, []byte("nodeGroups:\n- name: small\n  nodeSelector: {gpu.example.com/group: small}\n  count: 3\n  model: SMALL\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := c.startPlugin(t, "11111111-old", "--node-groups="+inv)
	oldK := old.register(ctx, false)
	devices := waitForSlices(t, ctx, c, "v1", 3)
	if m := devices[0].Attributes["model"].StringValue; m == nil || *m != "SMALL" {
		t.Errorf("node group not applied: %+v", devices[0].Attributes)
	}
	claim := c.allocatedClaim(t, ctx, "rolling", []string{"gpu-2"})
	before, err := oldK.prepare(ctx, claim)
	if err != nil {
		t.Fatal(err)
	}

	successor := c.startPlugin(t, "22222222-new", "--node-groups="+inv)
	newK := successor.register(ctx, false)
	if oldK.info.Endpoint == newK.info.Endpoint {
		t.Fatalf("both instances serve %s", oldK.info.Endpoint)
	}
	before1 := c.sliceVersions(t, ctx, "v1")
	old.terminate()
	// The successor would recreate a deleted slice under a new UID; the same UID and resource
	// version prove nobody deleted or rewrote it.
	time.Sleep(time.Second)
	if after1 := c.sliceVersions(t, ctx, "v1"); !slices.Equal(after1, before1) || len(after1) != 1 {
		t.Fatalf("after the old instance's SIGTERM slices are %v, before %v; want them untouched", after1, before1)
	}
	// The successor continues the claim prepared by the old instance.
	after, err := newK.prepare(ctx, claim)
	if err != nil || !reflect.DeepEqual(after, before) {
		t.Errorf("successor prepare = %v, %v; old instance said %v", after, err, before)
	}
	if err := newK.unprepare(ctx, claim); err != nil {
		t.Fatal(err)
	}
	successor.terminate()
	if after := c.sliceVersions(t, ctx, "v1"); !slices.Equal(after, before1) {
		t.Errorf("after the last instance's SIGTERM slices are %v, before %v; want them untouched", after, before1)
	}
}

// TestRepublish changes the Node's labels and the node-groups file under a running plugin and waits for
// the node's slice to follow; a broken edit of the file keeps what is published.
func TestRepublish(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := newCluster(t, v1Only, map[string]string{"gpu.example.com/group": "small"})
	inv := filepath.Join(filepath.Dir(c.kubeconfig), "inventory.yaml")
	write := func(content string) {
		if err := os.WriteFile(inv, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("nodeGroups:\n- name: small\n  nodeSelector: {gpu.example.com/group: small}\n  count: 2\n")
	p := c.startPlugin(t, "", "--node-groups="+inv, "--node-groups-poll-interval=200ms")
	k := p.register(ctx, false)
	waitForSlices(t, ctx, c, "v1", 2)

	node, err := c.srv.Clientset.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Labels = map[string]string{"gpu.example.com/group": "other"}
	if _, err := c.srv.Clientset.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForSlices(t, ctx, c, "v1", 8)
	// Devices beyond the old count are now preparable.
	if _, err := k.prepare(ctx, c.allocatedClaim(t, ctx, "gpu-7", []string{"gpu-7"})); err != nil {
		t.Errorf("prepare of a newly published device: %v", err)
	}

	write("defaults: {count: 4, model: NEXT-GPU-MODEL}\n")
	devices := waitForSlices(t, ctx, c, "v1", 4)
	if m := devices[0].Attributes["model"].StringValue; m == nil || *m != "NEXT-GPU-MODEL" {
		t.Errorf("model after file change: %+v", devices[0].Attributes["model"])
	}

	write("defaults: {count: -3}\n")
	time.Sleep(time.Second)
	if devices, _, err := c.slices(ctx, "v1"); err != nil || len(devices) != 4 {
		t.Errorf("after a broken edit: %d devices, %v; want the 4 published before", len(devices), err)
	}
}
