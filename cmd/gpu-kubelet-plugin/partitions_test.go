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

const (
	// partitionedInventory cuts every GPU of the node in 16 partitions: 8 x 17 devices.
	partitionedInventory = "defaults: {sharing: {mode: partitioned, partitions: 16}}\n"
	// partitionableDevices turns on KEP-4815 in a 1.34 API server (beta and on from 1.36).
	partitionableDevices = "DRAPartitionableDevices=true"
)

// TestPartitions runs the plugin with a partitioned node group against a 1.34 API server with
// partitionable devices on: it publishes each GPU's counter set in the slice of the devices that
// consume it (1.34's rule) within the per-slice limits, prepares partitions of one GPU for two
// claims, refuses the whole GPU beside them, and loses nothing when killed between prepares.
func TestPartitions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := newCluster(t, v1Only, nil, testapiserver.WithFeatureGates(partitionableDevices))
	inv := c.inventory(t, partitionedInventory)
	p := c.startPlugin(t, "", inv)
	k := p.register(ctx, false)

	waitForSlices(t, ctx, c, "v1", 8*17)
	list, err := c.srv.Clientset.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + c.node})
	if err != nil {
		t.Fatal(err)
	}
	sets := 0
	for _, s := range list.Items {
		if len(s.Spec.Devices) > 64 || len(s.Spec.SharedCounters) > 8 {
			t.Errorf("slice %s: %d devices, %d counter sets", s.Name, len(s.Spec.Devices), len(s.Spec.SharedCounters))
		}
		here := map[string]bool{}
		for _, set := range s.Spec.SharedCounters {
			here[set.Name] = true
			sets++
		}
		for _, d := range s.Spec.Devices {
			if len(d.ConsumesCounters) != 1 || !here[d.ConsumesCounters[0].CounterSet] {
				t.Errorf("slice %s: device %s consumes %+v, not a counter set of its slice", s.Name, d.Name, d.ConsumesCounters)
			}
		}
	}
	if sets != 8 || len(list.Items) != 3 {
		t.Errorf("%d counter sets in %d slices, want 8 in 3", sets, len(list.Items))
	}

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

// TestPartitionsFallBack: where the API server drops partitionable devices (1.34 by default),
// the same inventory publishes whole GPUs and says why, once.
func TestPartitionsFallBack(t *testing.T) {
	checkFallBack(t, partitionedInventory, "defaults: {count: 4, sharing: {mode: partitioned, partitions: 2}}\n",
		`group="defaults" want="partitioned" reason="API server drops sharedCounters (DRAPartitionableDevices off)"`,
		func(d resourceapi.Device) bool { return len(d.ConsumesCounters) == 0 && len(d.Capacity) == 1 })
}
