package celcheck

import (
	"fmt"
	"testing"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

func TestComparisons(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want string
	}{
		{`device.attributes["gpu.example.com"].model == "LATEST"`, `[{{false gpu.example.com model} == LATEST}]`},
		{`"LATEST" == device.attributes["gpu.example.com"].model`, `[{{false gpu.example.com model} == LATEST}]`},
		{`4 < device.attributes["gpu.example.com"].index`, `[{{false gpu.example.com index} > 4}]`},
		{`device.attributes["gpu.example.com"]["index"] <= 3 && device.attributes["gpu.example.com"].model != "X"`,
			`[{{false gpu.example.com index} <= 3} {{false gpu.example.com model} != X}]`},
		// Compared with another attribute or a function's result: no literal to suggest against.
		{`device.attributes["gpu.example.com"].index == device.attributes["gpu.example.com"].index`, `[]`},
		{`device.capacity["gpu.example.com"].memory.compareTo(quantity("80Gi")) >= 0`, `[]`},
		{`device.attributes["gpu.example.com"].driverVersion == semver("1.0.0")`, `[]`},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			a := New("gpu.example.com", deviceschema.DeviceSchema()).Analyze(tc.expr)
			if a.CompileError != "" {
				t.Fatal(a.CompileError)
			}
			if got := fmt.Sprint(a.Comparisons); got != tc.want && !(tc.want == "[]" && len(a.Comparisons) == 0) {
				t.Errorf("comparisons %s, want %s", got, tc.want)
			}
		})
	}
}
