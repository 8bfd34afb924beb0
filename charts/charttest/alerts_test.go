package charttest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
	"sigs.k8s.io/yaml"
)

func runPromtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(testapiserver.ToolBinary(t, "promtool"), args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// renderedRules is the spec of the chart's PrometheusRule on a cluster with the Prometheus
// Operator: a Prometheus rule file.
func renderedRules(t *testing.T, sets ...string) map[string]any {
	t.Helper()
	r := mustRender(t, capabilities(t, clusters[2], "monitoring.coreos.com/v1"), values(t, sets...))
	m, ok := r.find("PrometheusRule", releaseName)
	if !ok {
		t.Fatal("no PrometheusRule rendered with the Prometheus Operator served")
	}
	spec, _ := m.Obj["spec"].(map[string]any)
	return spec
}

func writeYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestAlertRules: the rendered rules pass `promtool check rules`, and each alert fires when and
// only when testdata/alerts/alerts-test.yaml says (`promtool test rules`).
func TestAlertRules(t *testing.T) {
	dir := t.TempDir()
	writeYAML(t, filepath.Join(dir, "rules.yaml"), renderedRules(t))
	tests, err := os.ReadFile(filepath.Join("testdata", "alerts", "alerts-test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts-test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, dir, "check", "rules", "rules.yaml")
	runPromtool(t, dir, "test", "rules", "alerts-test.yaml")
}

// TestAlertRunbooks: every alert's runbook_url names a section of docs/alerts.md, and every
// alert is tested.
func TestAlertRunbooks(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "alerts.md"))
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("testdata", "alerts", "alerts-test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## (\S+)`).FindAllStringSubmatch(string(doc), -1) {
		headings[strings.ToLower(m[1])] = true
	}
	spec := renderedRules(t)
	n := 0
	for _, g := range spec["groups"].([]any) {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			rule := r.(map[string]any)
			name, _ := rule["alert"].(string)
			if name == "" {
				continue
			}
			n++
			url, _ := rule["annotations"].(map[string]any)["runbook_url"].(string)
			_, anchor, _ := strings.Cut(url, "#")
			if anchor != strings.ToLower(name) || !headings[anchor] {
				t.Errorf("%s: runbook_url %q; want a `## %s` section in docs/alerts.md and its anchor", name, url, name)
			}
			if !strings.Contains(string(tests), "alertname: "+name+"\n") {
				t.Errorf("%s: no promtool test in testdata/alerts/alerts-test.yaml", name)
			}
		}
	}
	if n == 0 {
		t.Fatal("no alerts rendered")
	}
	if len(headings) != n {
		t.Errorf("docs/alerts.md has %d alert sections, the chart %d alerts", len(headings), n)
	}
}

// TestPrometheusRuleRendered: only where the Prometheus Operator is served, and not when disabled.
func TestPrometheusRuleRendered(t *testing.T) {
	for _, c := range clusters {
		if _, ok := mustRender(t, capabilities(t, c), nil).find("PrometheusRule", ""); ok {
			t.Errorf("%s without the Prometheus Operator: a PrometheusRule", c.name)
		}
	}
	withOperator := capabilities(t, clusters[2], "monitoring.coreos.com/v1")
	for _, set := range []string{"metrics.prometheusRule.enabled=false", "metrics.service.enabled=false"} {
		if _, ok := mustRender(t, withOperator, values(t, set)).find("PrometheusRule", ""); ok {
			t.Errorf("%s: a PrometheusRule", set)
		}
	}
	m, _ := mustRender(t, withOperator, values(t, "metrics.prometheusRule.labels.release=kube-prometheus-stack")).find("PrometheusRule", releaseName)
	if got := fmt.Sprint(m.Obj["metadata"].(map[string]any)["labels"].(map[string]any)["release"]); got != "kube-prometheus-stack" {
		t.Errorf("labels.release = %q", got)
	}
}
