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
	var file string
	for _, m := range r.Manifests {
		if data, ok := m.Obj["data"].(map[string]any); ok && m.kind() == "ConfigMap" {
			file, _ = data["inventory.yaml"].(string)
		}
	}
	cfg, err := nodegroups.ParseConfig([]byte(file))
	if err != nil {
		t.Fatalf("rendered inventory: %v\n%s", err, file)
	}
	_, spec := cfg.GroupFor(nil)
	mem, comp := spec.Sharing.MemoryPolicy(), spec.Sharing.ComputePolicy()
	if spec.ModeOf() != nodegroups.SharedMemory || mem.Min.String() != "2Gi" || mem.Step.String() != "2Gi" || comp.Min.String() != "10" || comp.Step.String() != "5" {
		t.Errorf("read back %+v: memory %s/%s compute %s/%s\n%s", spec.Sharing, mem.Min, mem.Step, comp.Min, comp.Step, file)
	}

	for set, want := range map[string]string{
		"inventory.nodeGroups[0].sharing.mode=partitioned": "value must be one of 'exclusive', 'shared-memory'",
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
