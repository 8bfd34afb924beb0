package plugin

import (
	"context"
	"errors"
	"strings"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

func TestSharingGate(t *testing.T) {
	const reason = "API server drops allowMultipleAllocations (DRAConsumableCapacity off)"
	for _, tc := range []struct {
		name       string
		answers    []error // per probe call: nil = dropped (reason), errors.ErrUnsupported = kept
		wantMode   []nodegroups.SharingMode
		wantProbes int
		wantLines  int
	}{
		{name: "kept", answers: []error{errors.ErrUnsupported}, wantMode: []nodegroups.SharingMode{"shared-memory", "shared-memory", "shared-memory"}, wantProbes: 1},
		{name: "dropped: one line per group", answers: []error{nil}, wantMode: []nodegroups.SharingMode{"exclusive", "exclusive", "exclusive"}, wantProbes: 1, wantLines: 2},
		{name: "probe failed, then kept", answers: []error{errors.New("forbidden"), errors.ErrUnsupported},
			wantMode: []nodegroups.SharingMode{"exclusive", "shared-memory", "shared-memory"}, wantProbes: 2, wantLines: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			ctx := klog.NewContext(context.Background(), logger)
			probes := 0
			g := &SharingGate{Probe: func(context.Context) (string, error) {
				a := tc.answers[min(probes, len(tc.answers)-1)]
				probes++
				switch {
				case errors.Is(a, errors.ErrUnsupported):
					return "", nil
				case a != nil:
					return "", a
				}
				return reason, nil
			}}
			shared := nodegroups.GroupSpec{Count: 2, Sharing: &nodegroups.Sharing{Mode: nodegroups.SharedMemory}}
			if got := g.Effective(ctx, "plain", nodegroups.GroupSpec{Count: 2}); got.ModeOf() != nodegroups.Exclusive || probes != 0 {
				t.Errorf("exclusive group: mode %s after %d probes, want exclusive without a probe", got.ModeOf(), probes)
			}
			for i, group := range []string{"a", "a", "b"} {
				if got := g.Effective(ctx, group, shared); got.ModeOf() != tc.wantMode[i] || got.Count != 2 {
					t.Errorf("call %d (group %s): %+v, want mode %s", i, group, got, tc.wantMode[i])
				}
			}
			if probes != tc.wantProbes {
				t.Errorf("%d probes, want %d", probes, tc.wantProbes)
			}
			logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			if n := strings.Count(logs, "Node group sharing falls back to exclusive"); n != tc.wantLines {
				t.Errorf("%d fallback lines, want %d:\n%s", n, tc.wantLines, logs)
			}
			if tc.wantLines > 0 && !strings.Contains(logs, `group="a" want="shared-memory" reason=`) {
				t.Errorf("fallback line lacks group, want, reason:\n%s", logs)
			}
		})
	}
}
