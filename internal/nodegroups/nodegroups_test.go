package nodegroups

import (
	"regexp"
	"strings"
	"testing"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

func TestForNode(t *testing.T) {
	cfg, err := LoadConfig("testdata/node-groups.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		labels     map[string]string
		wantCount  int
		wantModel  string
		wantMemory string
	}{
		{name: "default group", labels: map[string]string{"other": "x"}, wantCount: 8, wantModel: deviceschema.DefaultModel, wantMemory: "80Gi"},
		{name: "small group", labels: map[string]string{"gpu.example.com/group": "small"}, wantCount: 2, wantModel: "SMALL-GPU", wantMemory: "16Gi"},
		{name: "big group inherits model and memory", labels: map[string]string{"gpu.example.com/group": "big"}, wantCount: 16, wantModel: deviceschema.DefaultModel, wantMemory: "80Gi"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := cfg.ForNode(tc.labels)
			if got.Count != tc.wantCount || got.Model != tc.wantModel || got.Memory.String() != tc.wantMemory {
				t.Errorf("ForNode(%v) = count %d, model %q, memory %s; want %d, %q, %s",
					tc.labels, got.Count, got.Model, got.Memory.String(), tc.wantCount, tc.wantModel, tc.wantMemory)
			}
		})
	}
	if got := cfg.MaxDevicesPerNode(); got != 16 {
		t.Errorf("MaxDevicesPerNode = %d, want 16", got)
	}
}

func TestLoadConfigErrors(t *testing.T) {
	for name, want := range map[string]string{
		"testdata/missing.yaml": "read inventory config",
	} {
		if _, err := LoadConfig(name); err == nil || !regexp.MustCompile(want).MatchString(err.Error()) {
			t.Errorf("LoadConfig(%s) = %v, want %q", name, err, want)
		}
	}
}

// TestParseConfigCostlyQuantity: a quantity the decoder would parse for seconds is refused
// before it does, naming the field; a node selector may hold the same text.
func TestParseConfigCostlyQuantity(t *testing.T) {
	for _, tc := range []struct{ name, config, want string }{
		{"defaults memory", `defaults: {memory: "1e-5000000"}`, `defaults.memory: "1e-5000000": exponent out of range`},
		{"group memory", "nodeGroups:\n- name: big\n  nodeSelector: {size: \"1e-5000000\"}\n  memory: \"1e-99999999\"\n", `nodeGroups[0].memory: "1e-99999999": exponent out of range`},
		{"sharing step", "defaults:\n  sharing: {mode: shared-memory, memory: {step: \"1E+5000000\"}}\n", `defaults.sharing.memory.step: "1E+5000000": exponent out of range`},
		{"selector only", "nodeGroups:\n- name: big\n  nodeSelector: {size: \"1e-5000000\"}\n  memory: 40Gi\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.config))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("ParseConfig: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "80Gi") {
				t.Fatalf("ParseConfig: %v; want %q and the fix", err, tc.want)
			}
		})
	}
}
