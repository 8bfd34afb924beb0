package e2e

import (
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// observabilitySets shorten the unhealthy alert's wait so the test sees it fire.
var observabilitySets = []string{"metrics.prometheusRule.deviceUnhealthyFor=10s"}

// TestObservability: a real Prometheus scrapes the installed chart's plugin and webhook through
// their metrics Services, as the ServiceMonitors configure it, with the chart's rules. A running
// GPU pod's allocation series names its pod and container (where the kubelet says) and goes with
// the pod; a simulated fault fires GPUDRADeviceUnhealthy; every query of the chart's dashboard
// returns data from this cluster.
func TestObservability(t *testing.T) {
	c := framework.Setup(t)
	c.RequireLocal(t, "Prometheus runs on this machine and scrapes the pods' addresses")
	version := c.NewestResourceVersion(t)
	installSharing(t, c, version, observabilitySets...)
	objs := chartRender(t, c, observabilitySets...)
	prom := startPrometheus(t, c, objs)

	framework.Eventually(t, 2*time.Minute, "Prometheus to scrape the plugin and the webhook", func() (bool, error) {
		up, err := prom.query(`count by (job) (up{job=~"` + release + `-(kubelet-plugin|webhook)-metrics"} == 1)`)
		return len(up) == 2, err
	})

	ns := c.Namespace(t, "observability")
	applyVersioned(t, c, ns, version, templatesYAML)
	applyPods(t, c, ns, framework.TemplatePod("gpu-user", "one-gpu"))
	c.WaitForPodPhase(t, ns, "gpu-user", 2*time.Minute, corev1.PodRunning)
	node, dev := podDevice(t, c, ns, "gpu-user")

	t.Run("who holds which GPU", func(t *testing.T) {
		want := map[string]string{"namespace": ns, "device": dev, "node": node, "pod": "", "container": ""}
		if kubeletNamesContainers(t, c) {
			want["pod"], want["container"] = "gpu-user", "app"
		}
		var got []sample
		framework.Eventually(t, time.Minute, "the pod's allocation series in Prometheus", func() (bool, error) {
			var err error
			got, err = prom.query(`gpu_dra_device_allocation{namespace="` + ns + `"}`)
			return len(got) == 1 && matches(got[0].Metric, want), err
		})
		t.Logf("gpu_dra_device_allocation{namespace=%q}: %v", ns, got[0].Metric)
		// The join the docs show: the device's uuid and model from its info series.
		joined, err := prom.query(`gpu_dra_device_allocation{namespace="` + ns + `"} * on(node, device) group_left(model) gpu_dra_device_info`)
		if err != nil || len(joined) != 1 || joined[0].Metric["model"] == "" {
			t.Errorf("allocation joined with device info: %v %v", joined, err)
		}
	})

	t.Run("dashboard queries return data", func(t *testing.T) {
		cm := findObject(t, objs, "ConfigMap", release+"-dashboard")
		var d struct {
			Panels []struct {
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal([]byte(cm["data"].(map[string]any)["gpu-dra.json"].(string)), &d); err != nil {
			t.Fatal(err)
		}
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				framework.Eventually(t, time.Minute, "data for panel "+p.Title, func() (bool, error) {
					res, err := prom.query(tg.Expr)
					return len(res) > 0, err
				})
			}
		}
	})

	t.Run("a fault fires the unhealthy alert", func(t *testing.T) {
		kubectlDra(t, c, "fault", "set", node+"/"+dev, "--kind", "xid", "--message", "XID 79: observability e2e")
		defer kubectlDra(t, c, "fault", "clear", node+"/"+dev)
		framework.Eventually(t, 2*time.Minute, "GPUDRADeviceUnhealthy to fire for "+node, func() (bool, error) {
			alerts, err := prom.alerts()
			for _, a := range alerts {
				if a.Labels["alertname"] == "GPUDRADeviceUnhealthy" && a.Labels["node"] == node && a.State == "firing" {
					return true, nil
				}
			}
			return false, err
		})
	})

	t.Run("the series goes with the pod", func(t *testing.T) {
		c.Kubectl(t, "-n", ns, "delete", "pod", "gpu-user", "--wait=true")
		framework.Eventually(t, time.Minute, "no allocation series of "+ns, func() (bool, error) {
			got, err := prom.query(`gpu_dra_device_allocation{namespace="` + ns + `"}`)
			return len(got) == 0, err
		})
	})
}
