package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// prometheus is a real Prometheus (Debian's, unpacked by `make deps`) on this machine, scraping
// the chart's metrics Services' endpoints the way the chart's ServiceMonitors tell the Prometheus
// Operator to, with the rules of the chart's PrometheusRule.
type prometheus struct {
	url string
}

// chartRender is `helm template` of the chart with the Prometheus Operator's API served, so the
// PrometheusRule is in it, split into objects.
func chartRender(t *testing.T, c *framework.Cluster, sets ...string) []map[string]any {
	t.Helper()
	args := []string{"template", release, filepath.Join("..", "charts", "gpu-dra"), "-n", releaseNS, "--api-versions", "monitoring.coreos.com/v1"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out := c.Helm(t, args...)
	var objs []map[string]any
	for _, doc := range strings.Split(out, "\n---") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("helm template: %v", err)
		}
		if obj != nil {
			objs = append(objs, obj)
		}
	}
	return objs
}

func findObject(t *testing.T, objs []map[string]any, kind, name string) map[string]any {
	t.Helper()
	for _, o := range objs {
		if o["kind"] == kind && o["metadata"].(map[string]any)["name"] == name {
			return o
		}
	}
	t.Fatalf("helm template has no %s %s", kind, name)
	return nil
}

// scrapeConfig is what the ServiceMonitors ask of the operator: the endpoints of the chart's
// metrics Services, job = the Service's name, each series labelled with its pod's namespace, pod
// and node, the plugin's keeping their own namespace, pod and container labels (honorLabels).
// Debian's Prometheus is built without Kubernetes service discovery, so the test reads the
// EndpointSlices itself, as the operator would, and lists them as static targets.
func scrapeConfig(t *testing.T, c *framework.Cluster, rules string) map[string]any {
	t.Helper()
	job := func(component string, honor bool) map[string]any {
		service := release + "-" + component + "-metrics"
		var groups []any
		framework.Eventually(t, time.Minute, "endpoints of "+service, func() (bool, error) {
			slices, err := c.Clientset.DiscoveryV1().EndpointSlices(releaseNS).List(context.Background(),
				metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
			if err != nil {
				return false, err
			}
			groups = nil
			for _, sl := range slices.Items {
				port := int32(0)
				for _, p := range sl.Ports {
					if p.Name != nil && *p.Name == "metrics" && p.Port != nil {
						port = *p.Port
					}
				}
				for _, ep := range sl.Endpoints {
					if port == 0 || len(ep.Addresses) == 0 || ep.TargetRef == nil || (ep.Conditions.Ready != nil && !*ep.Conditions.Ready) {
						continue
					}
					groups = append(groups, map[string]any{
						"targets": []any{net.JoinHostPort(ep.Addresses[0], fmt.Sprint(port))},
						"labels": map[string]any{"job": service, "namespace": releaseNS, "pod": ep.TargetRef.Name,
							"node": ptr.Deref(ep.NodeName, "")},
					})
				}
			}
			return len(groups) > 0, nil
		})
		return map[string]any{"job_name": component, "honor_labels": honor, "static_configs": groups}
	}
	return map[string]any{
		"global":         map[string]any{"scrape_interval": "5s", "evaluation_interval": "5s"},
		"rule_files":     []any{rules},
		"scrape_configs": []any{job("kubelet-plugin", true), job("webhook", false)},
	}
}

// startPrometheus runs Prometheus for the test with the rules of the chart's PrometheusRule as
// rendered with sets.
func startPrometheus(t *testing.T, c *framework.Cluster, objs []map[string]any) *prometheus {
	t.Helper()
	dir := t.TempDir()
	rule := findObject(t, objs, "PrometheusRule", release)
	write := func(name string, v any) string {
		data, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rules := write("rules.yaml", rule["spec"])
	config := write("prometheus.yaml", scrapeConfig(t, c, rules))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	framework.HostProcess(t, "prometheus", "--config.file="+config, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--storage.tsdb.retention.time=1h")
	p := &prometheus{url: "http://" + addr}
	framework.Eventually(t, time.Minute, "Prometheus to be ready", func() (bool, error) {
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	return p
}

type sample struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
}

func (p *prometheus) get(path string, params url.Values, into any) error {
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(p.url + path + "?" + params.Encode())
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return err
	}
	if body.Status != "success" {
		return fmt.Errorf("%s: %s", path, body.Error)
	}
	return json.Unmarshal(body.Data, into)
}

// query runs an instant query; only vector results are expected.
func (p *prometheus) query(q string) ([]sample, error) {
	var data struct {
		ResultType string   `json:"resultType"`
		Result     []sample `json:"result"`
	}
	if err := p.get("/api/v1/query", url.Values{"query": {q}}, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("query %q: result type %s", q, data.ResultType)
	}
	return data.Result, nil
}

type alert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

func (p *prometheus) alerts() ([]alert, error) {
	var data struct {
		Alerts []alert `json:"alerts"`
	}
	err := p.get("/api/v1/alerts", nil, &data)
	return data.Alerts, err
}
