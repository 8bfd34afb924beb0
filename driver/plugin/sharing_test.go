package plugin

import (
	"context"
	"errors"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
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
			g := &SharingGate{ConsumableCapacity: func(context.Context) (string, error) {
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

// fakeServer answers dry-run creates of probe slices as an API server of one kind would.
type fakeServer func(*resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error)

func (f fakeServer) Create(_ context.Context, s *resourceapi.ResourceSlice, opts metav1.CreateOptions) (*resourceapi.ResourceSlice, error) {
	if len(opts.DryRun) != 1 || opts.DryRun[0] != metav1.DryRunAll {
		return nil, errors.New("probe without dry run")
	}
	return f(s.DeepCopy())
}

func TestProbePartitionable(t *testing.T) {
	invalid := apierrors.NewInvalid(schema.GroupKind{Group: "resource.k8s.io", Kind: "ResourceSlice"}, "", field.ErrorList{
		field.Invalid(field.NewPath("spec"), "", "only one of `sharedCounters` or `devices` is allowed")})
	for _, tc := range []struct {
		name       string
		server     fakeServer
		wantLayout CounterLayout
		wantReason string
		wantErr    string
	}{
		{name: "1.34 with the gate", server: func(s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error) { return s, nil },
			wantLayout: CountersWithDevices},
		{name: "1.35 and later", server: func(s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error) {
			if len(s.Spec.Devices) > 0 && len(s.Spec.SharedCounters) > 0 {
				return nil, invalid
			}
			return s, nil
		}, wantLayout: CountersInOwnSlices},
		{name: "gate off", server: func(s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error) {
			s.Spec.SharedCounters = nil
			for i := range s.Spec.Devices {
				s.Spec.Devices[i].ConsumesCounters = nil
			}
			return s, nil
		}, wantReason: "API server drops sharedCounters (DRAPartitionableDevices off)"},
		{name: "1.35 and later, gate off for devices only", server: func(s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error) {
			if len(s.Spec.Devices) > 0 && len(s.Spec.SharedCounters) > 0 {
				return nil, invalid
			}
			for i := range s.Spec.Devices {
				s.Spec.Devices[i].ConsumesCounters = nil
			}
			return s, nil
		}, wantReason: "API server drops consumesCounters (DRAPartitionableDevices off)"},
		{name: "forbidden", server: func(*resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error) {
			return nil, apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}, "", errors.New("no"))
		}, wantErr: "dry-run create of a ResourceSlice with sharedCounters: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			layout, reason, err := ProbePartitionable(context.Background(), tc.server, "gpu.example.com", "node-a")
			if tc.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr) {
					t.Errorf("error %v, want %s...", err, tc.wantErr)
				}
				return
			}
			if err != nil || reason != tc.wantReason || (reason == "" && layout != tc.wantLayout) {
				t.Errorf("probe = %s, %q, %v; want %s, %q", layout, reason, err, tc.wantLayout, tc.wantReason)
			}
		})
	}
}

// TestSharingGatePartitioned: a partitioned group probes for partitionable devices only, takes
// the layout found, and falls back once per group with the probe's reason.
func TestSharingGatePartitioned(t *testing.T) {
	for _, tc := range []struct {
		name     string
		layout   CounterLayout
		reason   string
		wantMode nodegroups.SharingMode
	}{
		{name: "1.34 with the gate", layout: CountersWithDevices, wantMode: nodegroups.Partitioned},
		{name: "1.37", layout: CountersInOwnSlices, wantMode: nodegroups.Partitioned},
		{name: "gate off", reason: "API server drops sharedCounters (DRAPartitionableDevices off)", wantMode: nodegroups.Exclusive},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			ctx := klog.NewContext(context.Background(), logger)
			probes := 0
			g := &SharingGate{
				ConsumableCapacity: func(context.Context) (string, error) { t.Error("consumable capacity probed"); return "", nil },
				Partitionable: func(context.Context) (CounterLayout, string, error) {
					probes++
					return tc.layout, tc.reason, nil
				},
			}
			parts := nodegroups.GroupSpec{Count: 2, Sharing: &nodegroups.Sharing{Mode: nodegroups.Partitioned, Partitions: 2}}
			for _, group := range []string{"a", "a", "b"} {
				if got := g.Effective(ctx, group, parts); got.ModeOf() != tc.wantMode {
					t.Errorf("group %s: mode %s, want %s", group, got.ModeOf(), tc.wantMode)
				}
			}
			if probes != 1 || g.Layout() != tc.layout {
				t.Errorf("%d probes, layout %s; want 1 and %s", probes, g.Layout(), tc.layout)
			}
			logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			wantLines := 0
			if tc.reason != "" {
				wantLines = 2
			}
			if n := strings.Count(logs, "Node group sharing falls back to exclusive"); n != wantLines ||
				(wantLines > 0 && !strings.Contains(logs, `group="a" want="partitioned" reason="`+tc.reason+`"`)) {
				t.Errorf("%d fallback lines, want %d naming group, want and reason:\n%s", n, wantLines, logs)
			}
		})
	}
	if (*SharingGate)(nil).Layout() != CountersInOwnSlices {
		t.Error("a nil gate does not lay counters out as 1.35+ wants")
	}
}

// TestSharingGateSharedPartitions: a shared-partitions group needs both probes' fields; without
// consumable capacity it publishes plain partitions of the same count, without partitionable
// devices exclusive GPUs, said once per group with the reason.
func TestSharingGateSharedPartitions(t *testing.T) {
	const (
		noCounters = "API server drops sharedCounters (DRAPartitionableDevices off)"
		noShares   = "API server drops allowMultipleAllocations (DRAConsumableCapacity off)"
	)
	for _, tc := range []struct {
		name                  string
		partitionable, shares string
		wantMode              nodegroups.SharingMode
		wantLine, wantReason  string
		wantConsumableProbes  int
	}{
		{name: "1.37", wantMode: nodegroups.SharedPartitions, wantConsumableProbes: 1},
		{name: "partitions only", shares: noShares, wantMode: nodegroups.Partitioned, wantConsumableProbes: 1,
			wantLine: "Node group sharing falls back to partitioned", wantReason: noShares},
		{name: "neither", partitionable: noCounters, shares: noShares, wantMode: nodegroups.Exclusive,
			wantLine: "Node group sharing falls back to exclusive", wantReason: noCounters},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			ctx := klog.NewContext(context.Background(), logger)
			consumable := 0
			g := &SharingGate{
				ConsumableCapacity: func(context.Context) (string, error) { consumable++; return tc.shares, nil },
				Partitionable: func(context.Context) (CounterLayout, string, error) {
					return CountersInOwnSlices, tc.partitionable, nil
				},
			}
			spec := nodegroups.GroupSpec{Count: 2, Sharing: &nodegroups.Sharing{Mode: nodegroups.SharedPartitions, Partitions: 4}}
			for _, group := range []string{"a", "a", "b"} {
				got := g.Effective(ctx, group, spec)
				if got.ModeOf() != tc.wantMode || (tc.wantMode.Partitions() && got.Sharing.Partitions != 4) {
					t.Errorf("group %s: sharing %+v, want mode %s", group, got.Sharing, tc.wantMode)
				}
			}
			if consumable != tc.wantConsumableProbes {
				t.Errorf("consumable capacity probed %d times, want %d", consumable, tc.wantConsumableProbes)
			}
			logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			if tc.wantLine == "" {
				if strings.Contains(logs, "falls back") {
					t.Errorf("a fallback line:\n%s", logs)
				}
				return
			}
			if n := strings.Count(logs, tc.wantLine); n != 2 ||
				!strings.Contains(logs, `group="a" want="shared-partitions" reason="`+tc.wantReason+`"`) {
				t.Errorf("%d lines %q, want 2 naming group, want and reason:\n%s", n, tc.wantLine, logs)
			}
		})
	}
}

// TestSharingGateAttachable: an attachable group publishes binding conditions where the API server
// keeps them, and exclusive GPUs, said once, where it drops them.
func TestSharingGateAttachable(t *testing.T) {
	kept := fakeServer(func(s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error) { return s, nil })
	dropped := fakeServer(func(s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error) {
		for i := range s.Spec.Devices {
			s.Spec.Devices[i].BindingConditions, s.Spec.Devices[i].BindingFailureConditions = nil, nil
		}
		return s, nil
	})
	for _, tc := range []struct {
		name      string
		server    fakeServer
		wantMode  nodegroups.SharingMode
		wantLines int
	}{
		{"kept", kept, nodegroups.Attachable, 0},
		{"dropped", dropped, nodegroups.Exclusive, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			ctx := klog.NewContext(context.Background(), logger)
			g := &SharingGate{BindingConditions: func(ctx context.Context) (string, error) {
				return ProbeBindingConditions(ctx, tc.server, "gpu.example.com", "node-a")
			}}
			spec := nodegroups.GroupSpec{Count: 2, Sharing: &nodegroups.Sharing{Mode: nodegroups.Attachable}}
			for range 2 {
				if got := g.Effective(ctx, "attach", spec); got.ModeOf() != tc.wantMode {
					t.Errorf("mode %s, want %s", got.ModeOf(), tc.wantMode)
				}
			}
			logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			if n := strings.Count(logs, "Node group sharing falls back to exclusive"); n != tc.wantLines {
				t.Errorf("%d fallback lines, want %d:\n%s", n, tc.wantLines, logs)
			}
			if tc.wantLines > 0 && !strings.Contains(logs, `want="attachable" reason="API server drops bindingConditions (DRADeviceBindingConditions or DRAResourceClaimDeviceStatus off)"`) {
				t.Errorf("fallback line lacks want and reason:\n%s", logs)
			}
		})
	}
}
