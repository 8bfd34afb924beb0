package main_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra/driver/cdi"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// partitionedInventory cuts every GPU of the node in 16 partitions: 8 x 17 devices.
const partitionedInventory = "defaults: {sharing: {mode: partitioned, partitions: 16}}\n"

// partitionsOn is, per kube-apiserver release, what turns partitionable devices (KEP-4815) on
// and where the API server wants the counter sets (plugin.CounterLayout): 1.34 in the slices of
// the devices that consume them (the 136 devices in 3), 1.35 and later in slices of their own
// (the devices in 3, the 8 counter sets in a fourth).
var partitionsOn = map[string]struct {
	gates       string
	withDevices bool
	slices      int
}{
	"1.34": {gates: "DRAPartitionableDevices=true", withDevices: true, slices: 3},
	"1.37": {slices: 4},
}

// TestPartitions runs the plugin with a partitioned node group against an API server with
// partitionable devices on: it publishes each GPU's counter set where the release wants it within
// the per-slice limits, prepares partitions of one GPU for two claims, refuses the whole GPU
// beside them, and loses nothing when killed between prepares.
func TestPartitions(t *testing.T) {
	minor := testapiserver.Minor(t)
	on, ok := partitionsOn[minor]
	if !ok {
		t.Skipf("SKIPPED: no expectations for kube-apiserver %s", minor)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := newCluster(t, v1Only, nil, testapiserver.WithFeatureGates(on.gates))
	inv := c.inventory(t, partitionedInventory)
	p := c.startPlugin(t, "", inv)
	k := p.register(ctx, false)

	waitForSlices(t, ctx, c, "v1", 8*17)
	list, err := c.srv.Clientset.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + c.node})
	if err != nil {
		t.Fatal(err)
	}
	checkCounterLayout(t, list.Items, on.withDevices, 8, on.slices)

	a := c.allocatedClaim(t, ctx, "part-a", []string{"gpu-0-partition-1"})
	b := c.allocatedClaim(t, ctx, "part-b", []string{"gpu-0-partition-2"})
	res, err := k.prepare(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if ids := res[a.UID][c.node+"/gpu-0-partition-1"]; len(ids) == 0 || !strings.HasSuffix(ids[0], string(a.UID)+"-gpu-0-partition-1") {
		t.Errorf("partition CDI IDs %v, want the partition's first", ids)
	}
	// Between partitions: the process dies after one is prepared and before the next.
	p.kill()
	p = c.startPlugin(t, "", inv)
	k = p.register(ctx, false)
	c.consistent(t)
	if _, err := k.prepare(ctx, a, b); err != nil {
		t.Fatal(err)
	}
	entries := c.consistent(t)
	if len(entries) != 2 {
		t.Fatalf("%d claims prepared, want 2", len(entries))
	}
	w, err := cdi.NewWriter(c.cdiRoot, driverName)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := os.ReadFile(w.SpecPath(b.UID))
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Devices []struct {
			ContainerEdits struct{ Env []string } `json:"containerEdits"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(spec, &parsed); err != nil || len(parsed.Devices) != 1 {
		t.Fatalf("CDI spec of part-b: %v\n%s", err, spec)
	}
	env := strings.Join(parsed.Devices[0].ContainerEdits.Env, "\n") + "\n"
	for _, want := range []string{"GPU_DEVICE_0_PARTITION_2=gpu-0-partition-2\n", "GPU_DEVICE_0_PARTITION_2_MEMORY=5Gi\n", "GPU_DEVICE_0_PARTITION_2_COMPUTE=6\n"} {
		if !strings.Contains(env, want) {
			t.Errorf("env of part-b lacks %s%s", want, env)
		}
	}

	// The whole GPU overlaps both partitions: refused, naming them; after they go, it fits.
	full := c.allocatedClaim(t, ctx, "full", []string{"gpu-0-full"})
	if _, err := k.prepare(ctx, full); err == nil || !strings.Contains(err.Error(), "device "+c.node+"/gpu-0-full needs compute 100 of counter set gpu-0-counters, which has 100 beside the devices prepared (") {
		t.Errorf("whole GPU beside its partitions: %v", err)
	}
	if err := k.unprepare(ctx, a, b); err != nil {
		t.Fatal(err)
	}
	if _, err := k.prepare(ctx, full); err != nil {
		t.Errorf("whole GPU after its partitions were released: %v", err)
	}
	logs, _ := os.ReadFile(p.log)
	if strings.Contains(string(logs), fallbackLine) {
		t.Errorf("the plugin fell back although the API server keeps the fields:\n%s", tail(string(logs), 20))
	}
	if metrics := scrape(t, p); strings.Contains(metrics, `component="publish_dropped_fields"`) {
		t.Errorf("the API server dropped fields of our slices:\n%s", metrics)
	}
}

// TestPartitionsFallBack: where the API server drops partitionable devices (1.34 by default,
// 1.36 and later with the gate off), the same inventory publishes whole GPUs and says why, once.
func TestPartitionsFallBack(t *testing.T) {
	checkFallBack(t, map[string]string{"1.34": "", "1.37": "DRAPartitionableDevices=false"}, partitionedInventory, "defaults: {count: 4, sharing: {mode: partitioned, partitions: 2}}\n",
		`group="defaults" want="partitioned" reason="API server drops sharedCounters (DRAPartitionableDevices off)"`,
		func(d resourceapi.Device) bool { return len(d.ConsumesCounters) == 0 && len(d.Capacity) == 1 })
}

// checkCounterLayout: the slices hold sets counter sets in all, in want slices; every device
// consumes one counter set, in its own slice withDevices, else one published in a slice without
// devices; and no slice is over the API server's limits.
func checkCounterLayout(t *testing.T, slices []resourceapi.ResourceSlice, withDevices bool, sets, want int) {
	t.Helper()
	published := map[string]bool{}
	for _, s := range slices {
		if len(s.Spec.Devices) > 64 || len(s.Spec.SharedCounters) > 8 {
			t.Errorf("slice %s: %d devices, %d counter sets", s.Name, len(s.Spec.Devices), len(s.Spec.SharedCounters))
		}
		if !withDevices && len(s.Spec.Devices) > 0 && len(s.Spec.SharedCounters) > 0 {
			t.Errorf("slice %s: devices and counter sets together, which this release refuses", s.Name)
		}
		for _, set := range s.Spec.SharedCounters {
			published[set.Name] = true
		}
	}
	for _, s := range slices {
		here := map[string]bool{}
		for _, set := range s.Spec.SharedCounters {
			here[set.Name] = true
		}
		for _, d := range s.Spec.Devices {
			if len(d.ConsumesCounters) != 1 || (withDevices && !here[d.ConsumesCounters[0].CounterSet]) || !published[d.ConsumesCounters[0].CounterSet] {
				t.Errorf("slice %s: device %s consumes %+v, not a counter set where the release wants it", s.Name, d.Name, d.ConsumesCounters)
			}
		}
	}
	if len(published) != sets || len(slices) != want {
		t.Errorf("%d counter sets in %d slices, want %d in %d", len(published), len(slices), sets, want)
	}
}
