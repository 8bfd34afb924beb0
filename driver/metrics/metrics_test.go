package metrics

import (
	"errors"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMetrics(t *testing.T) {
	m := New()
	m.ObservePrepare(2*time.Millisecond, nil)
	m.ObservePrepare(3*time.Millisecond, nil)
	m.ObservePrepare(time.Millisecond, errors.New("bad config"))
	m.ObserveUnprepare(time.Millisecond, nil)
	m.SetPrepared(1, nil)
	m.Error(ComponentPublishDroppedFields)

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		`gpu_dra_plugin_prepare_claims_total{result="success"} 2`,
		`gpu_dra_plugin_prepare_claims_total{result="error"} 1`,
		`gpu_dra_plugin_errors_total{component="prepare"} 1`,
		`gpu_dra_plugin_unprepare_claims_total{result="success"} 1`,
		`gpu_dra_plugin_prepare_duration_seconds_count 3`,
		`gpu_dra_plugin_prepared_claims 1`,
		`gpu_dra_plugin_errors_total{component="publish_dropped_fields"} 1`,
		`go_goroutines`,
		`process_resident_memory_bytes`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestErrorsHelp: the help of errors_total names exactly the components the plugin counts.
func TestErrorsHelp(t *testing.T) {
	m := New()
	for _, c := range Components {
		m.Error(c)
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	var help string
	var emitted []string
	for line := range strings.Lines(rec.Body.String()) {
		if h, ok := strings.CutPrefix(line, "# HELP gpu_dra_plugin_errors_total Errors by component: "); ok {
			help = strings.TrimSuffix(strings.TrimSpace(h), ".")
		}
		if rest, ok := strings.CutPrefix(line, `gpu_dra_plugin_errors_total{component="`); ok {
			emitted = append(emitted, rest[:strings.Index(rest, `"`)])
		}
	}
	listed := strings.Split(help, ", ")
	slices.Sort(listed)
	slices.Sort(emitted)
	if !slices.Equal(listed, emitted) {
		t.Errorf("errors_total help lists %q, the components counted are %q", listed, emitted)
	}
}
