// Package fleetmetricstest reads the fleet gauges in tests: every series of a collector by its
// name and labels.
package fleetmetricstest

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Gather scrapes c (through a pedantic registry, which checks its descriptions) and returns every
// series as Devices, Pending and Oldest name them, counters as name{}.
func Gather(t testing.TB, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(labels)
			out[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return out
}

// Devices names the series of gpu_dra_fleet_devices of model and state.
func Devices(model, state string) string {
	return fmt.Sprintf("gpu_dra_fleet_devices{model=%q,state=%q}", model, state)
}

// Pending names the series of gpu_dra_fleet_claims_pending of source and older_than.
func Pending(source, olderThan string) string {
	return fmt.Sprintf("gpu_dra_fleet_claims_pending{older_than=%q,source=%q}", olderThan, source)
}

// Oldest names the series of gpu_dra_fleet_claims_pending_oldest_seconds of source.
func Oldest(source string) string {
	return fmt.Sprintf("gpu_dra_fleet_claims_pending_oldest_seconds{source=%q}", source)
}

// Dropped names gpu_dra_fleet_model_series_dropped_total.
const Dropped = "gpu_dra_fleet_model_series_dropped_total{}"
