package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// observabilitySets shorten the unhealthy alert's wait so the test sees it fire.
var observabilitySets = []string{"metrics.prometheusRule.deviceUnhealthyFor=10s"}

// TestObservability: a real Prometheus scrapes the installed chart's plugin and webhook through
// their metrics Services, as the ServiceMonitors configure it, with the chart's rules. The
// webhook's fleet gauges count, by model, the devices the plugins publish, one more allocated
// with a running GPU pod, and the claim of a pod no device can satisfy as pending until the pod
// goes. A running GPU pod's allocation series names its pod and container (where the kubelet
// says) and goes with the pod; a simulated fault fires GPUDRADeviceUnhealthy (and, where the API
// server keeps device taints, the webhook counts the device unhealthy); every query of the
// chart's dashboard returns data from this cluster.
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

	// A claim of an earlier test whose namespace is still going away would be counted before and
	// freed while this test's pod takes a device (the same GPU, on one node): the allocated count
	// would not move. The fleet before is read once no claim holds a device.
	framework.Eventually(t, 2*time.Minute, "the claims of earlier tests to free their devices", func() (bool, error) {
		held, err := c.KubectlErr("get", "resourceclaims", "-A", "-o", "jsonpath={.items[?(@.status.allocation)].metadata.name}")
		return err == nil && strings.TrimSpace(held) == "", err
	})
	// The webhook's fleet before the GPU pod: every device the plugins publish, by model.
	before := webhookFleet(t, prom)
	ns := c.Namespace(t, "observability")
	applyVersioned(t, c, ns, version, templatesYAML)
	applyPods(t, c, ns, framework.TemplatePod("gpu-user", "one-gpu"))
	c.WaitForPodPhase(t, ns, "gpu-user", 2*time.Minute, corev1.PodRunning)
	node, dev := podDevice(t, c, ns, "gpu-user")
	model := deviceModel(t, prom, node, dev)

	t.Run("the webhook's fleet gauges", func(t *testing.T) {
		framework.Eventually(t, time.Minute, "the webhook to count "+model+" "+dev+" allocated", func() (bool, error) {
			now, err := fleetStates(prom)
			// A partition's whole GPU, or a whole GPU's partitions, become blocked rather than
			// allocated: free falls by one or more.
			return err == nil && now[model]["allocated"] == before[model]["allocated"]+1 &&
				now[model]["free"] <= before[model]["free"]-1, err
		})
		// A pod whose claim no device can satisfy: its claim waits, made from its template.
		waiting0, err := pendingClaims(prom)
		if err != nil {
			t.Fatal(err)
		}
		applyVersioned(t, c, ns, version, noSuchGPUTemplateYAML)
		applyPods(t, c, ns, framework.TemplatePod("gpu-waiting", "no-such-gpu"))
		framework.Eventually(t, time.Minute, "the webhook to count the waiting pod's claim", func() (bool, error) {
			n, err := pendingClaims(prom)
			return n == waiting0+1, err
		})
		framework.Eventually(t, time.Minute, "the oldest pending claim's age to grow", func() (bool, error) {
			res, err := prom.query(`max(gpu_dra_fleet_claims_pending_oldest_seconds{job="` + release + `-webhook-metrics", source="template"})`)
			return err == nil && len(res) == 1 && sampleValue(res[0]) > 0, err
		})
		c.Kubectl(t, "-n", ns, "delete", "pod", "gpu-waiting", "--wait=true")
		framework.Eventually(t, time.Minute, "the deleted pod's claim to leave the pending count", func() (bool, error) {
			n, err := pendingClaims(prom)
			return n == waiting0, err
		})
	})

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
		unhealthy0 := webhookFleet(t, prom)[model]["unhealthy"]
		kubectlDra(t, c, "fault", "set", node+"/"+dev, "--kind", "xid", "--message", "XID 79: observability e2e")
		defer kubectlDra(t, c, "fault", "clear", node+"/"+dev)
		if deviceTaintsKept(t, c) {
			// The plugin taints the device in its slice; the webhook counts it unhealthy.
			framework.Eventually(t, time.Minute, "the webhook to count "+dev+" unhealthy", func() (bool, error) {
				now, err := fleetStates(prom)
				return err == nil && now[model]["unhealthy"] == unhealthy0+1, err
			})
		}
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

// noSuchGPUTemplateYAML asks for a model no node has: its claims wait for ever.
const noSuchGPUTemplateYAML = `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: no-such-gpu
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.example.com
          selectors:
          - cel:
              expression: device.attributes["gpu.example.com"].model == "NO-SUCH-GPU-MODEL"
`

func sampleValue(s sample) float64 {
	if len(s.Value) != 2 {
		return math.NaN()
	}
	str, _ := s.Value[1].(string)
	v, err := strconv.ParseFloat(str, 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

// fleetStates is the webhook's gpu_dra_fleet_devices by model and state (the replicas agree:
// max).
func fleetStates(prom *prometheus) (map[string]map[string]float64, error) {
	res, err := prom.query(`max by (model, state) (gpu_dra_fleet_devices{job="` + release + `-webhook-metrics"})`)
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]float64{}
	for _, r := range res {
		m := r.Metric["model"]
		if out[m] == nil {
			out[m] = map[string]float64{}
		}
		out[m][r.Metric["state"]] = sampleValue(r)
	}
	return out, nil
}

// webhookFleet waits until the webhook's fleet gauges count, model by model, the devices the
// plugins publish (gpu_dra_device_info: one series per published device, partitions included),
// and returns them by model and state.
func webhookFleet(t *testing.T, prom *prometheus) map[string]map[string]float64 {
	t.Helper()
	var fleet map[string]map[string]float64
	var published []sample
	framework.Eventually(t, 2*time.Minute, "the webhook's fleet gauges to count the published devices", func() (bool, error) {
		var err error
		if fleet, err = fleetStates(prom); err != nil {
			return false, err
		}
		if published, err = prom.query(`count by (model) (gpu_dra_device_info{job="` + release + `-kubelet-plugin-metrics"})`); err != nil {
			return false, err
		}
		if len(published) == 0 || len(published) != len(fleet) {
			return false, nil
		}
		for _, p := range published {
			total := 0.0
			for _, n := range fleet[p.Metric["model"]] {
				total += n
			}
			if total != sampleValue(p) {
				return false, nil
			}
		}
		return true, nil
	})
	t.Logf("webhook fleet by model and state: %v; plugins publish %v", fleet, published)
	return fleet
}

// deviceModel is the model of the node's device, from the plugin's device info.
func deviceModel(t *testing.T, prom *prometheus, node, dev string) string {
	t.Helper()
	var res []sample
	framework.Eventually(t, time.Minute, "the model of "+node+"/"+dev, func() (bool, error) {
		var err error
		res, err = prom.query(`gpu_dra_device_info{node="` + node + `", device="` + dev + `"}`)
		return len(res) == 1, err
	})
	return res[0].Metric["model"]
}

// pendingClaims is the webhook's count of claims made for pods that have no allocation.
func pendingClaims(prom *prometheus) (float64, error) {
	res, err := prom.query(`max(gpu_dra_fleet_claims_pending{job="` + release + `-webhook-metrics", source="template", older_than="0s"})`)
	if err != nil {
		return 0, err
	}
	if len(res) != 1 {
		return 0, fmt.Errorf("claims pending: %d results, want 1", len(res))
	}
	return sampleValue(res[0]), nil
}
