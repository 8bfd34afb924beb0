package nodegroups

import (
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

func TestSharingForNode(t *testing.T) {
	cfg, err := LoadConfig("testdata/sharing.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name                      string
		labels                    map[string]string
		wantMode                  SharingMode
		wantMemMin, wantMemStep   string
		wantMemMax                string
		wantCompMin, wantCompStep string
		wantPartitions            int
	}{
		{name: "unset is exclusive", labels: nil, wantMode: Exclusive, wantMemMin: "1Gi", wantMemStep: "1Gi", wantCompMin: "1", wantCompStep: "1"},
		{name: "shared with defaults", labels: map[string]string{"g": "shared"}, wantMode: SharedMemory, wantMemMin: "1Gi", wantMemStep: "1Gi", wantCompMin: "1", wantCompStep: "1"},
		{name: "shared with policies", labels: map[string]string{"g": "tuned"}, wantMode: SharedMemory, wantMemMin: "4Gi", wantMemStep: "2Gi", wantMemMax: "40Gi", wantCompMin: "10", wantCompStep: "5"},
		{name: "partitioned", labels: map[string]string{"g": "parts"}, wantMode: Partitioned, wantPartitions: 4, wantMemMin: "1Gi", wantMemStep: "1Gi", wantCompMin: "1", wantCompStep: "1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := cfg.ForNode(tc.labels)
			if got.ModeOf() != tc.wantMode {
				t.Errorf("mode %q, want %q", got.ModeOf(), tc.wantMode)
			}
			if got.Sharing != nil && got.Sharing.Partitions != tc.wantPartitions {
				t.Errorf("partitions %d, want %d", got.Sharing.Partitions, tc.wantPartitions)
			}
			mem, comp := got.Sharing.MemoryPolicy(), got.Sharing.ComputePolicy()
			maxStr := ""
			if mem.Max != nil {
				maxStr = mem.Max.String()
			}
			if mem.Min.String() != tc.wantMemMin || mem.Step.String() != tc.wantMemStep || maxStr != tc.wantMemMax ||
				comp.Min.String() != tc.wantCompMin || comp.Step.String() != tc.wantCompStep {
				t.Errorf("memory %s/%s/%s compute %s/%s, want %s/%s/%s %s/%s", mem.Min, mem.Step, maxStr, comp.Min, comp.Step,
					tc.wantMemMin, tc.wantMemStep, tc.wantMemMax, tc.wantCompMin, tc.wantCompStep)
			}
		})
	}
}

func TestSharingValidation(t *testing.T) {
	for _, tc := range []struct{ name, config, want string }{
		{"partitioned without partitions", `nodeGroups: [{name: a, sharing: {mode: partitioned}}]`,
			"nodeGroups[0].sharing.partitions: required with mode partitioned; use 1..16"},
		{"zero partitions", `nodeGroups: [{name: a, sharing: {mode: partitioned, partitions: 0}}]`,
			"nodeGroups[0].sharing.partitions: required with mode partitioned; use 1..16"},
		{"too many partitions", `nodeGroups: [{name: a}, {name: b, sharing: {mode: partitioned, partitions: 17}}]`,
			"nodeGroups[1].sharing.partitions: 17 is out of range; use 1..16"},
		{"negative partitions", `defaults: {sharing: {mode: partitioned, partitions: -2}}`,
			"defaults.sharing.partitions: -2 is out of range; use 1..16"},
		{"partitions without partitioned", `nodeGroups: [{name: a, sharing: {mode: shared-memory, partitions: 4}}]`,
			"nodeGroups[0].sharing: partitions applies only to modes partitioned and shared-partitions; set one of them or remove it"},
		{"partitions on exclusive", `defaults: {sharing: {partitions: 4}}`,
			"defaults.sharing: partitions applies only to modes partitioned and shared-partitions; set one of them or remove it"},
		{"policy on partitioned", `nodeGroups: [{name: a, sharing: {mode: partitioned, partitions: 2, memory: {min: 2Gi}}}]`,
			"nodeGroups[0].sharing: memory and compute apply only to modes shared-memory and shared-partitions; set one of them or remove them"},
		{"unknown mode", `nodeGroups: [{name: a, sharing: {mode: timesliced}}]`,
			`nodeGroups[0].sharing.mode: unknown mode "timesliced"; use exclusive, shared-memory, partitioned, shared-partitions or attachable`},
		{"attach delay without attachable", `nodeGroups: [{name: a, sharing: {mode: shared-memory, attachDelay: 3s}}]`,
			"nodeGroups[0].sharing: attachDelay applies only to mode attachable; set it or remove attachDelay"},
		{"attach delay too long", `nodeGroups: [{name: a, sharing: {mode: attachable, attachDelay: 1h}}]`,
			"nodeGroups[0].sharing.attachDelay: 1h0m0s is out of range; use 0s..5m0s"},
		{"negative attach delay", `defaults: {sharing: {mode: attachable, attachDelay: -1s}}`,
			"defaults.sharing.attachDelay: -1s is out of range; use 0s..5m0s"},
		{"partitions on attachable", `nodeGroups: [{name: a, sharing: {mode: attachable, partitions: 2}}]`,
			"nodeGroups[0].sharing: partitions applies only to modes partitioned and shared-partitions; set one of them or remove it"},
		{"policy without shared-memory", `defaults: {sharing: {memory: {min: 2Gi}}}`,
			"defaults.sharing: memory and compute apply only to modes shared-memory and shared-partitions; set one of them or remove them"},
		{"min above memory", `nodeGroups: [{name: a, memory: 16Gi, sharing: {mode: shared-memory, memory: {min: 32Gi}}}]`,
			"nodeGroups[0].sharing.memory.min: 32Gi exceeds the GPU's 16Gi; use at most 16Gi"},
		{"inherited min above a group's memory", "defaults: {sharing: {mode: shared-memory, memory: {min: 20Gi, step: 4Gi}}}\nnodeGroups: [{name: a, memory: 16Gi}]",
			"defaults.sharing (inherited by nodeGroups[0]).memory.min: 20Gi exceeds the GPU's 16Gi; use at most 16Gi"},
		{"zero step", `nodeGroups: [{name: a, sharing: {mode: shared-memory, compute: {step: "0"}}}]`,
			"nodeGroups[0].sharing.compute.step: 0 must be positive, e.g. 1"},
		{"max below min", `nodeGroups: [{name: a, sharing: {mode: shared-memory, memory: {min: 8Gi, max: 4Gi}}}]`,
			"nodeGroups[0].sharing.memory.max: 4Gi is below min 8Gi; raise max or lower min"},
		{"whole GPU off the steps", `nodeGroups: [{name: a, sharing: {mode: shared-memory, memory: {min: 1Gi, step: 3Gi}}}]`,
			"nodeGroups[0].sharing.memory.step: the GPU's 80Gi is not min 1Gi plus a multiple of step 3Gi; choose min and step that reach it"},
		{"shared-partitions without partitions", `nodeGroups: [{name: a, sharing: {mode: shared-partitions}}]`,
			"nodeGroups[0].sharing.partitions: required with mode shared-partitions; use 1..16"},
		{"shared-partitions min above a partition", `nodeGroups: [{name: a, sharing: {mode: shared-partitions, partitions: 4, memory: {min: 32Gi}}}]`,
			"nodeGroups[0].sharing.memory.min: 32Gi exceeds a partition's 20Gi; use at most 20Gi"},
		{"a partition off the steps", `nodeGroups: [{name: a, sharing: {mode: shared-partitions, partitions: 3}}]`,
			"nodeGroups[0].sharing.memory.step: a partition's 28633115306 is not min 1Gi plus a multiple of step 1Gi; choose min and step that reach it"},
		{"one step too big", `nodeGroups: [{name: a, sharing: {mode: shared-memory, compute: {min: "60", step: "50"}}}]`,
			"nodeGroups[0].sharing.compute.step: min 60 plus step 50 exceeds the GPU's 100; lower min or step"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg Config
			if err := yaml.UnmarshalStrict([]byte(tc.config), &cfg); err != nil {
				t.Fatal(err)
			}
			err := cfg.Validate()
			if err == nil || err.Error() != tc.want {
				t.Errorf("Validate() = %v\nwant %s", err, tc.want)
			}
		})
	}
	var cfg Config
	if err := yaml.UnmarshalStrict([]byte(`nodeGroups: [{name: a, sharing: {mode: shared, extra: 1}}]`), &cfg); err == nil || !strings.Contains(err.Error(), "extra") {
		t.Errorf("unknown sharing field accepted: %v", err)
	}
}

// TestSharedPartitionsValid: partitions that divide the GPU on the policies' steps are accepted,
// also with a policy within a partition.
func TestSharedPartitionsValid(t *testing.T) {
	for _, config := range []string{
		`nodeGroups: [{name: a, sharing: {mode: shared-partitions, partitions: 4}}]`,
		`nodeGroups: [{name: a, sharing: {mode: shared-partitions, partitions: 2, memory: {min: 8Gi, step: 8Gi}, compute: {min: "10", step: "10"}}}]`,
	} {
		var cfg Config
		if err := yaml.UnmarshalStrict([]byte(config), &cfg); err != nil {
			t.Fatal(err)
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", config, err)
		}
	}
}

// TestAttachable: an attachable group's attach delay is its own or the default; a delay that is no
// duration is refused with the field's name.
func TestAttachable(t *testing.T) {
	cfg, err := LoadConfig("testdata/sharing.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for labels, want := range map[string]time.Duration{"attach": 5 * time.Second, "attach-default": DefaultAttachDelay} {
		got := cfg.ForNode(map[string]string{"g": labels})
		if got.ModeOf() != Attachable || got.Sharing.AttachDelayOf() != want {
			t.Errorf("group %s: mode %s, attach delay %s; want attachable, %s", labels, got.ModeOf(), got.Sharing.AttachDelayOf(), want)
		}
	}
	_, err = ParseConfig([]byte(`nodeGroups: [{name: a, sharing: {mode: attachable, attachDelay: soon}}]`))
	if err == nil || !strings.Contains(err.Error(), "attachDelay") {
		t.Errorf("ParseConfig with attachDelay: soon = %v, want an error naming attachDelay", err)
	}
}
