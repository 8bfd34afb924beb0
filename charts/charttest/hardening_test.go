package charttest

import (
	"maps"
	"path"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	psaapi "k8s.io/pod-security-admission/api"
	psapolicy "k8s.io/pod-security-admission/policy"
)

// TestClaimWebhookEntries: this driver's claims wait on the webhook as configured; everything
// else goes to an entry that fails open quickly, or nowhere (routing itself is checked on a real
// API server in testWebhookRouting).
func TestClaimWebhookEntries(t *testing.T) {
	type entry struct {
		name    string
		policy  admissionregistrationv1.FailurePolicyType
		timeout int32
	}
	for _, tc := range []struct {
		name   string
		sets   []string
		driver string
		want   []entry
	}{
		{name: "defaults", driver: "gpu.example.com", want: []entry{
			{"resourceclaims.gpu.example.com", admissionregistrationv1.Fail, 5},
			{"missing-class.resourceclaims.gpu.example.com", admissionregistrationv1.Ignore, 2},
		}},
		{name: "other claims off", sets: []string{"webhook.otherClaims.enabled=false", "webhook.timeoutSeconds=7"}, driver: "gpu.example.com", want: []entry{
			{"resourceclaims.gpu.example.com", admissionregistrationv1.Fail, 7},
		}},
		{name: "other driver name", sets: []string{"driverName=gpu.acme.org", "webhook.failurePolicy=Ignore", "webhook.otherClaims.timeoutSeconds=1"}, driver: "gpu.acme.org", want: []entry{
			{"resourceclaims.gpu.acme.org", admissionregistrationv1.Ignore, 5},
			{"missing-class.resourceclaims.gpu.acme.org", admissionregistrationv1.Ignore, 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRender(t, capabilities(t, clusters[2]), values(t, tc.sets...))
			m, _ := r.find("ValidatingWebhookConfiguration", "")
			var vwc admissionregistrationv1.ValidatingWebhookConfiguration
			decode(t, m, &vwc)
			if len(vwc.Webhooks) != len(tc.want) {
				t.Fatalf("%d webhooks, want %d", len(vwc.Webhooks), len(tc.want))
			}
			for i, w := range vwc.Webhooks {
				got := entry{w.Name, *w.FailurePolicy, *w.TimeoutSeconds}
				if got != tc.want[i] {
					t.Errorf("webhook %d = %+v, want %+v", i, got, tc.want[i])
				}
				var exprs []string
				for _, c := range w.MatchConditions {
					exprs = append(exprs, c.Expression)
				}
				all := strings.Join(exprs, "\n")
				if !strings.Contains(all, "'"+tc.driver+"'") || (tc.driver != "gpu.example.com" && strings.Contains(all, "gpu.example.com")) {
					t.Errorf("webhook %s matchConditions do not name driver %s:\n%s", w.Name, tc.driver, all)
				}
				if !strings.Contains(all, "resource-claim-controller") {
					t.Errorf("webhook %s: the resourceclaim controller's claims are sent", w.Name)
				}
			}
		})
	}
}

// TestPodDisruptionBudget: a budget must leave a replica evictable, or every drain of a node
// running one hangs; the chart refuses to render one that does not.
func TestPodDisruptionBudget(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sets    []string
		wantErr string // "" renders
		wantPDB bool
	}{
		{name: "defaults", wantPDB: true},
		{name: "one replica", sets: []string{"webhook.replicas=1"}, wantErr: "lets no webhook replica be evicted, so no node running one could ever be drained: lower minAvailable below replicas, raise replicas, or set webhook.podDisruptionBudget.enabled=false"},
		{name: "one replica, no budget", sets: []string{"webhook.replicas=1", "webhook.podDisruptionBudget.enabled=false"}},
		{name: "minAvailable equals replicas", sets: []string{"webhook.replicas=3", "webhook.podDisruptionBudget.minAvailable=3"}, wantErr: "minAvailable 3 with webhook.replicas 3"},
		{name: "percentage rounding up to all", sets: []string{"webhook.replicas=3", "webhook.podDisruptionBudget.minAvailable=67%"}, wantErr: "minAvailable 67% with webhook.replicas 3"},
		{name: "percentage leaving one", sets: []string{"webhook.replicas=3", "webhook.podDisruptionBudget.minAvailable=66%"}, wantPDB: true},
		{name: "100%", sets: []string{"webhook.podDisruptionBudget.minAvailable=100%"}, wantErr: "minAvailable 100%"},
		{name: "not a number", sets: []string{"webhook.podDisruptionBudget.minAvailable=most"}, wantErr: "minAvailable"},
		{name: "negative", sets: []string{"webhook.podDisruptionBudget.minAvailable=-1"}, wantErr: "minAvailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := render(t, capabilities(t, clusters[1]), values(t, tc.sets...))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			m, ok := r.find("PodDisruptionBudget", "")
			if ok != tc.wantPDB {
				t.Fatalf("PodDisruptionBudget rendered = %v, want %v", ok, tc.wantPDB)
			}
			if !ok {
				return
			}
			var pdb policyv1.PodDisruptionBudget
			decode(t, m, &pdb)
			d, _ := r.find("Deployment", "gpu-dra-webhook")
			var dep appsv1.Deployment
			decode(t, d, &dep)
			replicas := int(*dep.Spec.Replicas)
			// As the disruption controller computes it.
			minPods, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MinAvailable, replicas, true)
			if err != nil || minPods >= replicas {
				t.Errorf("minAvailable %v of %d replicas leaves none evictable (%v)", pdb.Spec.MinAvailable, replicas, err)
			}
		})
	}
}

// TestWebhookPriorityClass: with failurePolicy Fail the webhook is part of the control path of
// every GPU pod, so it is not the first to go under node pressure; the default is allowed in any
// namespace of a default cluster (the Priority admission plugin has not limited system-* classes
// to kube-system since 1.17).
func TestWebhookPriorityClass(t *testing.T) {
	for _, tc := range []struct {
		sets []string
		want string
	}{
		{nil, "system-cluster-critical"},
		{[]string{"webhook.priorityClassName=gpu-critical"}, "gpu-critical"},
		{[]string{"webhook.priorityClassName="}, ""},
	} {
		r := mustRender(t, capabilities(t, clusters[1]), values(t, tc.sets...))
		if got := renderedPods(t, r)["webhook"].Spec.PriorityClassName; got != tc.want {
			t.Errorf("--set %v: webhook priorityClassName %q, want %q", tc.sets, got, tc.want)
		}
	}
}

// TestPluginTolerations checks the DaemonSet's tolerations with the scheduler's own matching.
func TestPluginTolerations(t *testing.T) {
	taint := func(key string) *corev1.Taint {
		return &corev1.Taint{Key: key, Value: "present", Effect: corev1.TaintEffectNoSchedule}
	}
	for _, tc := range []struct {
		name       string
		vals       map[string]any
		tolerated  []string
		untolerate []string
	}{
		{name: "defaults", vals: values(t), tolerated: []string{"nvidia.com/gpu", "gpu.example.com"}, untolerate: []string{"example.com/dedicated"}},
		{name: "driver name", vals: values(t, "driverName=gpu.acme.org"), tolerated: []string{"nvidia.com/gpu", "gpu.acme.org"}, untolerate: []string{"gpu.example.com"}},
		{name: "own list", vals: values(t, "kubeletPlugin.tolerations[0].key=amd.com/gpu", "kubeletPlugin.tolerations[0].operator=Exists"),
			tolerated: []string{"amd.com/gpu", "gpu.example.com"}, untolerate: []string{"nvidia.com/gpu"}},
		{name: "none", vals: map[string]any{"kubeletPlugin": map[string]any{"tolerations": []any{}, "tolerateDriverTaint": false}},
			untolerate: []string{"nvidia.com/gpu", "gpu.example.com"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rendered := renderedPods(t, mustRender(t, capabilities(t, clusters[1]), tc.vals))
			tolerations := rendered["plugin"].Spec.Tolerations
			// The cleanup hook may have only GPU nodes to run on.
			if cleanup := rendered["cleanup"].Spec.Tolerations; !reflect.DeepEqual(cleanup, tolerations) {
				t.Errorf("cleanup hook tolerates %+v, the plugin %+v", cleanup, tolerations)
			}
			for _, key := range tc.tolerated {
				if !corev1helpers.TolerationsTolerateTaint(klog.Background(), tolerations, taint(key), false) {
					t.Errorf("the plugin does not tolerate %s:NoSchedule (tolerations %+v)", key, tolerations)
				}
			}
			for _, key := range tc.untolerate {
				if corev1helpers.TolerationsTolerateTaint(klog.Background(), tolerations, taint(key), false) {
					t.Errorf("the plugin tolerates %s:NoSchedule", key)
				}
			}
		})
	}
}

// TestPluginHostDirectories: the plugin sees the kubelet's registration directory, its own
// driver's directory under plugins/ (at the same path as on the host: the kubelet dials the
// socket the plugin registers), the CDI directory and, read-only and only for the allocation
// metrics, the kubelet's PodResources socket directory; not the other plugins' directories.
func TestPluginHostDirectories(t *testing.T) {
	for _, tc := range []struct {
		sets []string
		want []string
	}{
		{nil, []string{"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/gpu.example.com", "/var/run/cdi", "/var/lib/kubelet/pod-resources"}},
		{[]string{"driverName=gpu.acme.org", "kubeletPlugin.kubeletDir=/data/kubelet/", "kubeletPlugin.cdiRoot=/etc/cdi"},
			[]string{"/data/kubelet/plugins_registry", "/data/kubelet/plugins/gpu.acme.org", "/etc/cdi", "/data/kubelet/pod-resources"}},
		{[]string{"metrics.allocations=false"},
			[]string{"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/gpu.example.com", "/var/run/cdi"}},
	} {
		spec := renderedPods(t, mustRender(t, capabilities(t, clusters[1]), values(t, tc.sets...)))["plugin"].Spec
		c := spec.Containers[0]
		var hostPaths []string
		for _, v := range spec.Volumes {
			if v.HostPath == nil {
				continue
			}
			hostPaths = append(hostPaths, v.HostPath.Path)
			i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == v.Name })
			if i < 0 || c.VolumeMounts[i].MountPath != v.HostPath.Path {
				t.Errorf("--set %v: host path %s is not mounted at the same path", tc.sets, v.HostPath.Path)
			} else if strings.HasSuffix(v.HostPath.Path, "/pod-resources") != c.VolumeMounts[i].ReadOnly {
				t.Errorf("--set %v: host path %s mounted read-only: %v; only pod-resources should be", tc.sets, v.HostPath.Path, c.VolumeMounts[i].ReadOnly)
			}
		}
		if !slices.Equal(hostPaths, tc.want) {
			t.Errorf("--set %v: host paths %v, want exactly %v", tc.sets, hostPaths, tc.want)
		}
		// The plugin's data directory (--kubelet-plugins-dir/<driver>) is the one mounted.
		driver := strings.TrimPrefix(c.Command[slices.IndexFunc(c.Command, func(a string) bool { return strings.HasPrefix(a, "--driver-name=") })], "--driver-name=")
		for _, a := range c.Command {
			if dir, ok := strings.CutPrefix(a, "--kubelet-plugins-dir="); ok && path.Join(dir, driver) != tc.want[1] {
				t.Errorf("--set %v: data directory %s, mounted %s", tc.sets, path.Join(dir, driver), tc.want[1])
			}
		}
	}
}

// TestPodSecurityLevel evaluates every rendered pod with the Pod Security admission's own checks:
// the plugin needs the privileged level (host paths), which the chart's NOTES tell the user to
// label the namespace with; everything else runs under restricted.
func TestPodSecurityLevel(t *testing.T) {
	evaluator, err := psapolicy.NewEvaluator(psapolicy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := mustRender(t, capabilities(t, clusters[1]), values(t, installSets...))
	lowest := map[string]psaapi.Level{}
	for name, pod := range renderedPods(t, r) {
		for _, level := range []psaapi.Level{psaapi.LevelRestricted, psaapi.LevelBaseline, psaapi.LevelPrivileged} {
			res := psapolicy.AggregateCheckResults(evaluator.EvaluatePod(psaapi.LevelVersion{Level: level, Version: psaapi.LatestVersion()}, &pod.ObjectMeta, &pod.Spec))
			if res.Allowed {
				lowest[name] = level
				break
			}
			t.Logf("%s at %s: %s", name, level, res.ForbiddenDetail())
		}
	}
	want := map[string]psaapi.Level{"plugin": psaapi.LevelPrivileged, "webhook": psaapi.LevelRestricted, "cleanup": psaapi.LevelRestricted}
	for name, level := range want {
		if lowest[name] != level {
			t.Errorf("%s runs at Pod Security level %q at the lowest, want %q", name, lowest[name], level)
		}
	}
	if label := "kubectl label namespace gpu-dra pod-security.kubernetes.io/enforce=privileged"; !strings.Contains(r.Notes, label) {
		t.Errorf("NOTES.txt does not tell the user to run %q:\n%s", label, r.Notes)
	}
}

// renderedPods are the pod templates of the plugin, the webhook and the cleanup hook.
func renderedPods(t *testing.T, r rendered) map[string]corev1.PodTemplateSpec {
	t.Helper()
	out := map[string]corev1.PodTemplateSpec{}
	for _, m := range r.Manifests {
		switch m.kind() {
		case "DaemonSet":
			var o appsv1.DaemonSet
			decode(t, m, &o)
			out["plugin"] = o.Spec.Template
		case "Deployment":
			var o appsv1.Deployment
			decode(t, m, &o)
			out["webhook"] = o.Spec.Template
		case "Job":
			var o batchv1.Job
			decode(t, m, &o)
			out["cleanup"] = o.Spec.Template
		}
	}
	return out
}

// networkPolicySets enable the optional NetworkPolicy with a source of each kind; the OpenAPI and
// real API server tests render the chart with them too.
var networkPolicySets = []string{
	"webhook.networkPolicy.enabled=true",
	"webhook.networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.10/32",
	"webhook.networkPolicy.webhookFrom[1].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=kube-system",
	"webhook.networkPolicy.webhookFrom[1].podSelector.matchLabels.k8s-app=konnectivity-agent",
	"webhook.networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
}

// TestNetworkPolicy: off by default; when on, it selects exactly the webhook's pods and opens
// the admission and metrics ports, by the container's own port names, to the configured
// sources only.
func TestNetworkPolicy(t *testing.T) {
	caps := capabilities(t, clusters[1])
	if _, ok := mustRender(t, caps, nil).find("NetworkPolicy", ""); ok {
		t.Error("a NetworkPolicy is rendered by default")
	}
	for _, tc := range []struct {
		name string
		sets []string
		// want is port number -> number of peers allowed to reach it.
		want map[int32]int
	}{
		{name: "no sources", sets: []string{"webhook.networkPolicy.enabled=true"}, want: map[int32]int{}},
		{name: "sources", sets: networkPolicySets, want: map[int32]int{9443: 2, 8080: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRender(t, caps, values(t, tc.sets...))
			m, ok := r.find("NetworkPolicy", "gpu-dra-webhook")
			if !ok {
				t.Fatal("no NetworkPolicy")
			}
			var np networkingv1.NetworkPolicy
			decode(t, m, &np)
			sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if err != nil {
				t.Fatal(err)
			}
			for name, pod := range renderedPods(t, r) {
				if got := sel.Matches(labels.Set(pod.Labels)); got != (name == "webhook") {
					t.Errorf("policy selects the %s pods: %v", name, got)
				}
			}
			if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) || np.Spec.Ingress == nil {
				t.Errorf("policy types %v, ingress %v: want the pods isolated for ingress", np.Spec.PolicyTypes, np.Spec.Ingress)
			}
			ports := map[string]int32{}
			for _, p := range renderedPods(t, r)["webhook"].Spec.Containers[0].Ports {
				ports[p.Name] = p.ContainerPort
			}
			got := map[int32]int{}
			for _, rule := range np.Spec.Ingress {
				if len(rule.From) == 0 {
					t.Errorf("an ingress rule without sources admits everyone: %+v", rule)
				}
				for _, p := range rule.Ports {
					number, ok := ports[p.Port.StrVal]
					if !ok {
						t.Errorf("rule names port %v, which the webhook container does not have", p.Port)
					}
					got[number] += len(rule.From)
				}
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("sources per port %v, want %v", got, tc.want)
			}
		})
	}
	for _, bad := range []string{"webhook.networkPolicy.webhookFrom[0].ipBlock.cdir=10.0.0.0/8", "webhook.networkPolicy.metricsFrom[0].everyone=true"} {
		if _, err := render(t, caps, values(t, bad)); err == nil || !strings.Contains(err.Error(), "networkPolicy") {
			t.Errorf("--set %s: err = %v, want the schema to refuse it", bad, err)
		}
	}
}

// TestExcludedNamespacesFlag: the webhook is told exactly the namespaces every webhook entry's
// namespaceSelector excludes, so that it refuses reviews for them (only a client other than the API
// server sends one) from the same list.
func TestExcludedNamespacesFlag(t *testing.T) {
	r := mustRender(t, capabilities(t, clusters[1]), nil)
	var flagged []string
	for _, arg := range renderedPods(t, r)["webhook"].Spec.Containers[0].Command {
		if v, ok := strings.CutPrefix(arg, "--excluded-namespaces="); ok {
			flagged = append(flagged, strings.Split(v, ",")...)
		}
	}
	if want := []string{"kube-system", releaseNS}; !slices.Equal(flagged, want) {
		t.Errorf("--excluded-namespaces lists %q, want %q", flagged, want)
	}
	var selectors []*metav1.LabelSelector
	m, _ := r.find("ValidatingWebhookConfiguration", "")
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	decode(t, m, &vwc)
	for _, w := range vwc.Webhooks {
		selectors = append(selectors, w.NamespaceSelector)
	}
	m, _ = r.find("MutatingWebhookConfiguration", "")
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	decode(t, m, &mwc)
	for _, w := range mwc.Webhooks {
		selectors = append(selectors, w.NamespaceSelector)
	}
	for i, sel := range selectors {
		if sel == nil || len(sel.MatchExpressions) != 1 || sel.MatchExpressions[0].Key != "kubernetes.io/metadata.name" ||
			sel.MatchExpressions[0].Operator != metav1.LabelSelectorOpNotIn || !slices.Equal(sel.MatchExpressions[0].Values, flagged) {
			t.Errorf("webhook entry %d: namespaceSelector %+v, want NotIn %q", i, sel, flagged)
		}
	}
}
