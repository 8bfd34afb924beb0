package charttest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
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

// TestDashboardDocumented: docs/metrics.md lists every panel of the dashboard, and nothing else,
// and each metric a row names is one its panel queries.
func TestDashboardDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Dashboard panels\n")
	if !ok {
		t.Fatal("docs/metrics.md has no \"## Dashboard panels\" section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	documented := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^\| ([^|]+?) \| (.+) \|$`).FindAllStringSubmatch(section, -1) {
		if m[1] != "panel" && !strings.HasPrefix(m[1], "---") {
			documented[m[1]] = m[2]
		}
	}
	d, _ := renderedDashboard(t)
	metric := regexp.MustCompile("`((gpu_dra|controller_runtime)_[a-z_]+)")
	for _, p := range d.Panels {
		shows, ok := documented[p.Title]
		if !ok {
			t.Errorf("panel %q is not in docs/metrics.md's panel list", p.Title)
			continue
		}
		delete(documented, p.Title)
		for _, m := range metric.FindAllStringSubmatch(shows, -1) {
			queried := false
			for _, tg := range p.Targets {
				queried = queried || strings.Contains(tg.Expr, m[1])
			}
			if !queried {
				t.Errorf("panel %q: the docs say it shows %s; its queries do not read it", p.Title, m[1])
			}
		}
	}
	for title := range documented {
		t.Errorf("docs/metrics.md lists a panel %q the dashboard does not have", title)
	}
}
