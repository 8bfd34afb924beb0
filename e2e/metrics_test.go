package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// allocationSeries are the plugin's gpu_dra_device_allocation series of namespace ns, each as
// its labels.
func allocationSeries(t *testing.T, c *framework.Cluster, ns string) []map[string]string {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(pluginMetrics(t, c)))
	if err != nil {
		t.Fatalf("parse the plugin's metrics: %v", err)
	}
	var out []map[string]string
	if f, ok := families["gpu_dra_device_allocation"]; ok {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == ns {
				out = append(out, labels)
			}
		}
	}
	return out
}

// kubeletNamesContainers: the kubelet's PodResources API lists DRA devices by container from
// 1.34 on (the KubeletPodResourcesDynamicResources gate, alpha and off before).
func kubeletNamesContainers(t *testing.T, c *framework.Cluster) bool {
	t.Helper()
	v, err := c.Clientset.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	minor, _ := strconv.Atoi(strings.TrimSuffix(v.Minor, "+"))
	return minor >= 34
}

// checkAllocationMetrics: the running pod's device is in the plugin's allocation series with its
// claim, the uuid the node publishes for it and, where the kubelet says, its pod and container;
// the series goes once the pod is deleted (call the returned function then).
func checkAllocationMetrics(t *testing.T, c *framework.Cluster, ns, pod, container, claim, device string) (gone func()) {
	t.Helper()
	want := map[string]string{"namespace": ns, "claim": claim, "device": device, "pod": "", "container": ""}
	if kubeletNamesContainers(t, c) {
		want["pod"], want["container"] = pod, container
	}
	var got []map[string]string
	// The plugin asks the kubelet at most every 10 s: a scrape right after the start may still
	// have the answer from before the container existed.
	framework.Eventually(t, time.Minute, "the pod's allocation series", func() (bool, error) {
		got = allocationSeries(t, c, ns)
		return len(got) == 1 && matches(got[0], want) && strings.HasPrefix(got[0]["uuid"], "gpu-"), nil
	})
	t.Logf("allocation series: %v", got)
	return func() {
		framework.Eventually(t, time.Minute, "the allocation series to go with the pod", func() (bool, error) {
			return len(allocationSeries(t, c, ns)) == 0, nil
		})
	}
}

func matches(labels, want map[string]string) bool {
	for k, v := range want {
		if labels[k] != v {
			return false
		}
	}
	return true
}
