package charttest

import (
	"strings"
	"testing"

	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// TestInventorySharing: a node group's sharing renders into the inventory the plugin and webhook
// read, and reads back as the mode and policies given; modes the plugin cannot publish are refused
// at install.
func TestInventorySharing(t *testing.T) {
	caps := capabilities(t, clusters[2])
	r := mustRender(t, caps, values(t,
		"inventory.nodeGroups[0].name=shared",
		"inventory.nodeGroups[0].sharing.mode=shared-memory",
		"inventory.nodeGroups[0].sharing.memory.min=2Gi",
		"inventory.nodeGroups[0].sharing.memory.step=2Gi",
		"inventory.nodeGroups[0].sharing.compute.min=10",
		"inventory.nodeGroups[0].sharing.compute.step=5",
	))
	cfg, file := renderedInventory(t, r)
	_, spec := cfg.GroupFor(nil)
	mem, comp := spec.Sharing.MemoryPolicy(), spec.Sharing.ComputePolicy()
	if spec.ModeOf() != nodegroups.SharedMemory || mem.Min.String() != "2Gi" || mem.Step.String() != "2Gi" || comp.Min.String() != "10" || comp.Step.String() != "5" {
		t.Errorf("read back %+v: memory %s/%s compute %s/%s\n%s", spec.Sharing, mem.Min, mem.Step, comp.Min, comp.Step, file)
	}

	for set, want := range map[string]string{
		"inventory.nodeGroups[0].sharing.mode=timesliced":  "value must be one of 'exclusive', 'shared-memory', 'partitioned'",
		"inventory.nodeGroups[0].sharing.mode=partitioned": "/inventory/nodeGroups/0/sharing",
		"inventory.defaults.sharing.partitions=17":         "/inventory/defaults/sharing/partitions",
		"inventory.nodeGroups[0].sharing.memory.minimum=1": "additional properties 'minimum' not allowed",
		"inventory.defaults.sharing.compute.step=one":      "/inventory/defaults/sharing/compute/step",
		"inventory.nodeGroups[0].sharing.memory.max=-4Gi":  "/inventory/nodeGroups/0/sharing/memory/max",
	} {
		_, err := render(t, caps, values(t, "inventory.nodeGroups[0].name=a", set))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--set %s: %v, want the schema to refuse it with %q", set, err, want)
		}
	}
}

// TestInventoryPartitioned: a partitioned node group renders into the inventory and reads back
// with its partitions; NOTES.txt says what sharing needs of the cluster, and only when a group
// asks for it.
func TestInventoryPartitioned(t *testing.T) {
	caps := capabilities(t, clusters[2])
	r := mustRender(t, caps, values(t,
		"inventory.nodeGroups[0].name=parts",
		"inventory.nodeGroups[0].nodeSelector.pool=parts",
		"inventory.nodeGroups[0].sharing.mode=partitioned",
		"inventory.nodeGroups[0].sharing.partitions=4",
		"inventory.defaults.sharing.mode=shared-memory",
	))
	cfg, file := renderedInventory(t, r)
	if group, spec := cfg.GroupFor(map[string]string{"pool": "parts"}); group != "parts" || spec.ModeOf() != nodegroups.Partitioned || spec.Sharing.Partitions != 4 {
		t.Errorf("read back group %s: %+v\n%s", group, spec.Sharing, file)
	}
	for _, want := range []string{
		"Sharing: defaults (shared-memory), node group parts (partitioned) ask for shared GPUs.",
		"DRAConsumableCapacity", "DRAPartitionableDevices", "Kubernetes 1.36",
		`"Node group sharing falls back to exclusive" once per group`,
	} {
		if !strings.Contains(r.Notes, want) {
			t.Errorf("NOTES.txt lacks %q:\n%s", want, r.Notes)
		}
	}
	plain := mustRender(t, caps, values(t, "inventory.nodeGroups[0].name=a", "inventory.nodeGroups[0].sharing.mode=exclusive"))
	if strings.Contains(plain.Notes, "Sharing:") {
		t.Errorf("NOTES.txt speaks of sharing without a sharing group:\n%s", plain.Notes)
	}
}

// renderedInventory is the inventory file the chart renders for the plugin and webhook, read back.
func renderedInventory(t *testing.T, r rendered) (*nodegroups.Config, string) {
	t.Helper()
	var file string
	for _, m := range r.Manifests {
		if data, ok := m.Obj["data"].(map[string]any); ok && m.kind() == "ConfigMap" && data["inventory.yaml"] != nil {
			file, _ = data["inventory.yaml"].(string)
		}
	}
	cfg, err := nodegroups.ParseConfig([]byte(file))
	if err != nil {
		t.Fatalf("rendered inventory: %v\n%s", err, file)
	}
	return cfg, file
}
