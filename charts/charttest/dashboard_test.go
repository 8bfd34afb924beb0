package charttest

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

type dashboard struct {
	UID    string `json:"uid"`
	Panels []struct {
		ID         int    `json:"id"`
		Title      string `json:"title"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// renderedDashboard is the dashboard JSON of the chart's ConfigMap.
func renderedDashboard(t *testing.T) (dashboard, map[string]any) {
	t.Helper()
	r := mustRender(t, capabilities(t, clusters[2]), nil)
	m, ok := r.find("ConfigMap", releaseName+"-dashboard")
	if !ok {
		t.Fatal("no dashboard ConfigMap")
	}
	meta := m.Obj["metadata"].(map[string]any)
	data, _ := m.Obj["data"].(map[string]any)["gpu-dra.json"].(string)
	var d dashboard
	if err := json.Unmarshal([]byte(data), &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	return d, meta
}

// TestDashboard: the ConfigMap carries Grafana's sidecar label; every panel has a unique id, the
// data source variable and at least one query; every query is valid PromQL (checked by promtool
// as a recording rule) and selects this release's jobs.
func TestDashboard(t *testing.T) {
	d, meta := renderedDashboard(t)
	if got := meta["labels"].(map[string]any)["grafana_dashboard"]; got != "1" {
		t.Errorf("label grafana_dashboard = %v, want \"1\"", got)
	}
	if len(d.Panels) == 0 {
		t.Fatal("no panels")
	}
	ids := map[int]bool{}
	var rules []map[string]any
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: datasource %q, %d queries", p.Title, p.Datasource.UID, len(p.Targets))
		}
		for i, tg := range p.Targets {
			if strings.Contains(tg.Expr, "__") || !strings.Contains(tg.Expr, `job="gpu-dra-`) {
				t.Errorf("panel %q: query %q does not select this release's job", p.Title, tg.Expr)
			}
			rules = append(rules, map[string]any{"record": fmt.Sprintf("panel_%d_%d", p.ID, i), "expr": tg.Expr})
		}
	}
	dir := t.TempDir()
	writeYAML(t, filepath.Join(dir, "panels.yaml"), map[string]any{"groups": []any{map[string]any{"name": "panels", "rules": rules}}})
	runPromtool(t, dir, "check", "rules", "panels.yaml")
}

// TestDashboardDisabled: no ConfigMap without the metrics Services or when disabled.
func TestDashboardDisabled(t *testing.T) {
	for _, set := range []string{"metrics.dashboard.enabled=false", "metrics.service.enabled=false"} {
		if _, ok := mustRender(t, capabilities(t, clusters[2]), values(t, set)).find("ConfigMap", releaseName+"-dashboard"); ok {
			t.Errorf("%s: a dashboard ConfigMap", set)
		}
	}
}
