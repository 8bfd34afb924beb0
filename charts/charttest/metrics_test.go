package charttest

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor the chart writes.
type serviceMonitor struct {
	Metadata struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port        string `json:"port"`
			Path        string `json:"path"`
			Scheme      string `json:"scheme"`
			Interval    string `json:"interval"`
			Relabelings []struct {
				SourceLabels []string `json:"sourceLabels"`
				TargetLabel  string   `json:"targetLabel"`
			} `json:"relabelings"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// metricsPorts maps a component to the container port its /metrics listens on, by port name.
func metricsPorts(t *testing.T, r rendered) map[string]corev1.PodTemplateSpec {
	t.Helper()
	pods := renderedPods(t, r)
	return map[string]corev1.PodTemplateSpec{"kubelet-plugin": pods["plugin"], "webhook": pods["webhook"]}
}

func containerPort(pod corev1.PodTemplateSpec, name string) int32 {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return p.ContainerPort
			}
		}
	}
	return 0
}

// TestMetricsServices: every cluster gets a headless metrics Service per component that selects
// exactly that component's pods and reaches the container port the binary serves /metrics on
// (--metrics-bind-address=:8080).
func TestMetricsServices(t *testing.T) {
	for _, c := range clusters {
		t.Run(c.name, func(t *testing.T) {
			r := mustRender(t, capabilities(t, c), nil)
			pods := metricsPorts(t, r)
			for component, pod := range pods {
				m, ok := r.find("Service", "gpu-dra-"+component+"-metrics")
				if !ok {
					t.Fatalf("no metrics Service for %s", component)
				}
				var svc corev1.Service
				decode(t, m, &svc)
				if svc.Spec.ClusterIP != corev1.ClusterIPNone || svc.Namespace != releaseNS {
					t.Errorf("%s: clusterIP %q namespace %q, want a headless Service in %s", svc.Name, svc.Spec.ClusterIP, svc.Namespace, releaseNS)
				}
				for other, otherPod := range pods {
					if got := labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(otherPod.Labels)); got != (other == component) {
						t.Errorf("%s selects the %s pods: %t", svc.Name, other, got)
					}
				}
				if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].TargetPort.StrVal != "metrics" || containerPort(pod, "metrics") != 8080 {
					t.Errorf("%s: ports %+v; the %s container's metrics port is %d", svc.Name, svc.Spec.Ports, component, containerPort(pod, "metrics"))
				}
			}
		})
	}
	r := mustRender(t, capabilities(t, clusters[1]), values(t, "metrics.service.enabled=false"))
	for _, m := range r.Manifests {
		if m.kind() == "Service" && m.name() != "gpu-dra-webhook" {
			t.Errorf("metrics.service.enabled=false still renders Service %s", m.name())
		}
	}
}

// TestServiceMonitors: rendered only where the cluster serves monitoring.coreos.com/v1 (the kind
// does not exist elsewhere and the install would fail), one per metrics Service, selecting it by
// its labels and scraping its metrics port.
func TestServiceMonitors(t *testing.T) {
	count := func(r rendered) int {
		n := 0
		for _, m := range r.Manifests {
			if m.kind() == "ServiceMonitor" {
				n++
			}
		}
		return n
	}
	for _, c := range clusters {
		if n := count(mustRender(t, capabilities(t, c), nil)); n != 0 {
			t.Errorf("%s without the Prometheus Operator: %d ServiceMonitors", c.name, n)
		}
	}
	withOperator := capabilities(t, clusters[2], "monitoring.coreos.com/v1")
	if n := count(mustRender(t, withOperator, values(t, "metrics.serviceMonitor.enabled=false"))); n != 0 {
		t.Errorf("serviceMonitor.enabled=false: %d ServiceMonitors", n)
	}
	if n := count(mustRender(t, withOperator, values(t, "metrics.service.enabled=false"))); n != 0 {
		t.Errorf("without metrics Services: %d ServiceMonitors", n)
	}
	r := mustRender(t, withOperator, values(t, "metrics.serviceMonitor.labels.release=kube-prometheus-stack", "metrics.serviceMonitor.interval=1m"))
	if n := count(r); n != 2 {
		t.Fatalf("%d ServiceMonitors, want 2", n)
	}
	for _, component := range []string{"kubelet-plugin", "webhook"} {
		m, ok := r.find("ServiceMonitor", "gpu-dra-"+component)
		if !ok {
			t.Fatalf("no ServiceMonitor for %s", component)
		}
		data, _ := json.Marshal(m.Obj)
		var sm serviceMonitor
		if err := json.Unmarshal(data, &sm); err != nil {
			t.Fatal(err)
		}
		svcManifest, _ := r.find("Service", "gpu-dra-"+component+"-metrics")
		var svc corev1.Service
		decode(t, svcManifest, &svc)
		if !labels.SelectorFromSet(sm.Spec.Selector.MatchLabels).Matches(labels.Set(svc.Labels)) {
			t.Errorf("%s does not select Service %s (labels %v)", sm.Metadata.Name, svc.Name, svc.Labels)
		}
		if sm.Metadata.Namespace != releaseNS || len(sm.Spec.NamespaceSelector.MatchNames) != 1 || sm.Spec.NamespaceSelector.MatchNames[0] != releaseNS {
			t.Errorf("%s: namespace %q, namespaceSelector %v", sm.Metadata.Name, sm.Metadata.Namespace, sm.Spec.NamespaceSelector.MatchNames)
		}
		if sm.Metadata.Labels["release"] != "kube-prometheus-stack" {
			t.Errorf("%s: labels %v lack the configured release label", sm.Metadata.Name, sm.Metadata.Labels)
		}
		if len(sm.Spec.Endpoints) != 1 {
			t.Fatalf("%s: endpoints %+v", sm.Metadata.Name, sm.Spec.Endpoints)
		}
		e := sm.Spec.Endpoints[0]
		if e.Port != svc.Spec.Ports[0].Name || e.Path != "/metrics" || e.Scheme != "http" || e.Interval != "1m" {
			t.Errorf("%s: endpoint %+v", sm.Metadata.Name, e)
		}
		if nodeLabel := len(e.Relabelings) == 1 && e.Relabelings[0].TargetLabel == "node"; nodeLabel != (component == "kubelet-plugin") {
			t.Errorf("%s: relabelings %+v; the plugin's series, and only those, get the node", sm.Metadata.Name, e.Relabelings)
		}
	}
	if _, err := render(t, withOperator, values(t, "metrics.serviceMonitor.interval=soon")); err == nil {
		t.Error("interval=soon rendered; the schema should reject it")
	}
}
