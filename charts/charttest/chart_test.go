package charttest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	release "helm.sh/helm/v4/pkg/release/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/certs"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// decode converts a rendered object into a typed one, rejecting fields the type does not have.
func decode(t testing.TB, m manifest, into any) {
	t.Helper()
	data, err := json.Marshal(m.Obj)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatalf("%s %s (%s): %v", m.kind(), m.name(), m.Source, err)
	}
}

func TestLint(t *testing.T) {
	for _, tc := range []struct {
		name string
		kube string
		sets []string
	}{
		{"defaults-1.32", kubeOldest, nil},
		{"defaults-1.37", kubeNewest, nil},
		{"install-1.34", kubeSeed, installSets},
		{"cert-manager", kubeSeed, []string{"certs.mode=cert-manager"}},
		{"secret", kubeNewest, []string{"certs.mode=secret", "certs.secret.name=tls", "certs.secret.caBundle=Q0EK"}},
		{"v1beta1-no-hooks", kubeOldest, []string{"resourceApiVersion=v1beta1", "cleanup.enabled=false", "admissionPolicy.enabled=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kv, err := common.ParseKubeVersion(tc.kube)
			if err != nil {
				t.Fatal(err)
			}
			l := action.NewLint()
			l.Strict = true
			l.Namespace = releaseNS
			l.KubeVersion = kv
			res := l.Run([]string{chartDir}, values(t, tc.sets...))
			for _, m := range res.Messages {
				if m.Severity > support.InfoSev {
					t.Errorf("helm lint: %s", m)
				} else {
					t.Logf("helm lint: %s", m)
				}
			}
			for _, err := range res.Errors {
				t.Errorf("helm lint: %v", err)
			}
			if res.TotalChartsLinted != 1 {
				t.Errorf("linted %d charts, want 1", res.TotalChartsLinted)
			}
		})
	}
}

// dryRunInstall is Helm's install action for `helm install --dry-run` of the release on kv.
func dryRunInstall(kv *common.KubeVersion) *action.Install {
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.Replace = true
	install.ReleaseName = releaseName
	install.Namespace = releaseNS
	install.KubeVersion = kv
	return install
}

// TestHelmInstallDryRun is `helm install gpu-dra charts/gpu-dra -n gpu-dra --set ... --dry-run`
// through Helm's own install action: kubeVersion constraint, schema, hooks and notes included.
func TestHelmInstallDryRun(t *testing.T) {
	for _, kube := range []string{kubeOldest, kubeSeed, kubeNewest} {
		t.Run(kube, func(t *testing.T) {
			kv, err := common.ParseKubeVersion(kube)
			if err != nil {
				t.Fatal(err)
			}
			rel, err := dryRunInstall(kv).Run(loadChart(t), values(t, installSets...))
			if err != nil {
				t.Fatalf("helm install --dry-run: %v", err)
			}
			r, ok := rel.(*release.Release)
			if !ok {
				t.Fatalf("release of type %T", rel)
			}
			for _, want := range []string{"kind: DaemonSet", "kind: Deployment", "kind: DeviceClass", "kind: ValidatingWebhookConfiguration", "kind: MutatingWebhookConfiguration"} {
				if !strings.Contains(r.Manifest, want) {
					t.Errorf("manifest has no %q", want)
				}
			}
			var hooks []string
			for _, h := range r.Hooks {
				hooks = append(hooks, h.Kind+"/"+h.Name)
			}
			slices.Sort(hooks)
			wantHooks := []string{"ClusterRole/gpu-dra-cleanup", "ClusterRoleBinding/gpu-dra-cleanup", "Job/gpu-dra-cleanup", "Role/gpu-dra-cleanup", "RoleBinding/gpu-dra-cleanup", "ServiceAccount/gpu-dra-cleanup"}
			if !slices.Equal(hooks, wantHooks) {
				t.Errorf("hooks = %v, want %v", hooks, wantHooks)
			}
			if !strings.Contains(r.Info.Notes, "gpu.example.com/count=2") || !strings.Contains(r.Info.Notes, "kubectl get resourceslices") {
				t.Errorf("NOTES.txt does not show the next steps:\n%s", r.Info.Notes)
			}
		})
	}
	t.Run("too-old", func(t *testing.T) {
		kv, _ := common.ParseKubeVersion("v1.31.5")
		if _, err := dryRunInstall(kv).Run(loadChart(t), nil); err == nil || !strings.Contains(err.Error(), "1.32") {
			t.Errorf("install on 1.31: err = %v, want the kubeVersion constraint to refuse", err)
		}
	})
}

func TestResourceAPIVersion(t *testing.T) {
	for _, c := range clusters {
		t.Run(c.name, func(t *testing.T) {
			r := mustRender(t, capabilities(t, c), nil)
			dc, ok := r.find("DeviceClass", "gpu.example.com")
			if !ok {
				t.Fatal("no DeviceClass gpu.example.com")
			}
			if got := dc.apiVersion(); got != c.wantResourceAPI {
				t.Errorf("DeviceClass apiVersion = %s, want %s", got, c.wantResourceAPI)
			}
			if !strings.Contains(r.Notes, "apiVersion: "+c.wantResourceAPI) {
				t.Errorf("NOTES.txt example is not in %s:\n%s", c.wantResourceAPI, r.Notes)
			}
		})
	}
	t.Run("v1beta2-only", func(t *testing.T) {
		c := cluster{kubeVersion: "v1.33.0", resourceVersions: []string{"v1beta1", "v1beta2"}}
		r := mustRender(t, capabilities(t, c), nil)
		if dc, _ := r.find("DeviceClass", ""); dc.apiVersion() != "resource.k8s.io/v1beta2" {
			t.Errorf("apiVersion = %s, want resource.k8s.io/v1beta2", dc.apiVersion())
		}
	})
	t.Run("override", func(t *testing.T) {
		r := mustRender(t, capabilities(t, clusters[2]), values(t, "resourceApiVersion=v1beta1"))
		if dc, _ := r.find("DeviceClass", ""); dc.apiVersion() != "resource.k8s.io/v1beta1" {
			t.Errorf("apiVersion = %s, want the override resource.k8s.io/v1beta1", dc.apiVersion())
		}
	})
	t.Run("dra-disabled", func(t *testing.T) {
		_, err := render(t, capabilities(t, cluster{kubeVersion: "v1.32.0"}), nil)
		if err == nil || !strings.Contains(err.Error(), "runtime-config=resource.k8s.io/v1beta1=true") {
			t.Errorf("err = %v, want advice to enable DRA", err)
		}
	})
}

// The DeviceClass's fields are the same in every version, so it must render identically but for
// apiVersion.
func TestDeviceClassSameInEveryVersion(t *testing.T) {
	var want map[string]any
	for _, v := range []string{"v1", "v1beta2", "v1beta1"} {
		r := mustRender(t, capabilities(t, clusters[1]), values(t, "resourceApiVersion="+v))
		dc, _ := r.find("DeviceClass", "gpu.example.com")
		got := map[string]any{"metadata": dc.Obj["metadata"], "spec": dc.Obj["spec"]}
		if want == nil {
			want = got
			continue
		}
		a, _ := json.Marshal(want)
		b, _ := json.Marshal(got)
		if string(a) != string(b) {
			t.Errorf("DeviceClass in %s differs from v1:\n%s\n%s", v, b, a)
		}
	}
	sel := want["spec"].(map[string]any)["selectors"].([]any)[0].(map[string]any)["cel"].(map[string]any)["expression"]
	if sel != `device.driver == "gpu.example.com"` {
		t.Errorf("selector = %v", sel)
	}
}

func TestValuesSchema(t *testing.T) {
	for _, tc := range []struct {
		set, wantErr string
	}{
		{"certs.mode=vault", "/certs/mode"},
		{"webhook.failurePolicy=Maybe", "failurePolicy"},
		{"resourceApiVersion=v1alpha3", "resourceApiVersion"},
		{"webhook.deny={missing-class,typo}", "deny"},
		{"unknownKey=1", "unknownKey"},
		{"webhook.replica=3", "replica"},
		{"inventory.defaults.count=0", "count"},
		{"inventory.defaults.memory=lots", "memory"},
		{"inventory.nodeGroups[0].count=4", "name"},
		{"image.pullPolicy=Sometimes", "pullPolicy"},
		{"certs.mode=secret", "caBundle"},
	} {
		t.Run(tc.set, func(t *testing.T) {
			_, err := render(t, capabilities(t, clusters[1]), values(t, tc.set))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("--set %s: err = %v, want one naming %q", tc.set, err, tc.wantErr)
			}
		})
	}
}

// The ConfigMap must be what internal/nodegroups reads, strictly, for every shape of values.
func TestInventoryConfigMap(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sets     []string
		wantMax  int
		wantNode map[string]string
		wantSpec nodegroups.GroupSpec
	}{
		{name: "defaults", wantMax: 8, wantSpec: nodegroups.GroupSpec{Count: 8, Model: "LATEST-GPU-MODEL"}},
		{
			name: "node-groups",
			sets: []string{
				"inventory.nodeGroups[0].name=big", "inventory.nodeGroups[0].nodeSelector.pool=big",
				"inventory.nodeGroups[0].count=16", "inventory.nodeGroups[0].model=BIG", "inventory.nodeGroups[0].memory=160Gi",
			},
			wantMax: 16, wantNode: map[string]string{"pool": "big"}, wantSpec: nodegroups.GroupSpec{Count: 16, Model: "BIG"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRender(t, capabilities(t, clusters[2]), values(t, tc.sets...))
			cm, ok := r.find("ConfigMap", "gpu-dra-inventory")
			if !ok {
				t.Fatal("no inventory ConfigMap")
			}
			var obj corev1.ConfigMap
			decode(t, cm, &obj)
			path := filepath.Join(t.TempDir(), "inventory.yaml")
			if err := os.WriteFile(path, []byte(obj.Data["inventory.yaml"]), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := nodegroups.LoadConfig(path)
			if err != nil {
				t.Fatalf("internal/nodegroups cannot read the rendered ConfigMap: %v", err)
			}
			if got := cfg.MaxDevicesPerNode(); got != tc.wantMax {
				t.Errorf("MaxDevicesPerNode = %d, want %d", got, tc.wantMax)
			}
			spec := cfg.ForNode(tc.wantNode)
			if spec.Count != tc.wantSpec.Count || spec.Model != tc.wantSpec.Model {
				t.Errorf("ForNode(%v) = %d %s, want %d %s", tc.wantNode, spec.Count, spec.Model, tc.wantSpec.Count, tc.wantSpec.Model)
			}
			// Both components mount it at the path their flags name.
			for _, kind := range []string{"DaemonSet", "Deployment"} {
				m, _ := r.find(kind, "")
				var spec corev1.PodSpec
				if kind == "DaemonSet" {
					var ds appsv1.DaemonSet
					decode(t, m, &ds)
					spec = ds.Spec.Template.Spec
				} else {
					var d appsv1.Deployment
					decode(t, m, &d)
					spec = d.Spec.Template.Spec
				}
				if !mountsConfigMap(spec, "gpu-dra-inventory", "/etc/gpu-dra") || !slices.Contains(spec.Containers[0].Command, "--node-groups=/etc/gpu-dra/inventory.yaml") {
					t.Errorf("%s does not mount the inventory at /etc/gpu-dra/inventory.yaml", kind)
				}
			}
		})
	}
}

func mountsConfigMap(spec corev1.PodSpec, cm, path string) bool {
	for _, v := range spec.Volumes {
		if v.ConfigMap == nil || v.ConfigMap.Name != cm {
			continue
		}
		for _, m := range spec.Containers[0].VolumeMounts {
			if m.Name == v.Name && m.MountPath == path {
				return true
			}
		}
	}
	return false
}

// TestPodSecurity pins the privileges of every container (SPEC §10).
func TestPodSecurity(t *testing.T) {
	r := mustRender(t, capabilities(t, clusters[1]), nil)
	ds, _ := r.find("DaemonSet", "")
	var daemonSet appsv1.DaemonSet
	decode(t, ds, &daemonSet)
	if s := daemonSet.Spec.UpdateStrategy.RollingUpdate; s == nil || s.MaxSurge.IntValue() != 1 || s.MaxUnavailable.IntValue() != 0 {
		t.Errorf("DaemonSet rolling update = %+v, want maxSurge 1, maxUnavailable 0", s)
	}
	d, _ := r.find("Deployment", "")
	var deployment appsv1.Deployment
	decode(t, d, &deployment)
	if *deployment.Spec.Replicas != 2 {
		t.Errorf("webhook replicas = %d, want 2", *deployment.Spec.Replicas)
	}
	aa := deployment.Spec.Template.Spec.Affinity.PodAntiAffinity
	if aa == nil || len(aa.RequiredDuringSchedulingIgnoredDuringExecution) > 0 || len(aa.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		aa.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != corev1.LabelHostname {
		t.Errorf("webhook anti-affinity must be preferred by hostname only (single-node clusters): %+v", aa)
	}
	pods := map[string]corev1.PodSpec{}
	for name, tmpl := range renderedPods(t, r) {
		pods[name] = tmpl.Spec
	}
	if len(pods) != 3 {
		t.Fatalf("pods rendered: %v", slices.Collect(mapsKeys(pods)))
	}
	for name, spec := range pods {
		for _, c := range spec.Containers {
			sc := c.SecurityContext
			switch {
			case sc == nil:
				t.Errorf("%s/%s: no securityContext", name, c.Name)
				continue
			case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
				t.Errorf("%s/%s: root filesystem not read-only", name, c.Name)
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Errorf("%s/%s: privilege escalation allowed", name, c.Name)
			case sc.Privileged != nil && *sc.Privileged:
				t.Errorf("%s/%s: privileged", name, c.Name)
			case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
				t.Errorf("%s/%s: capabilities %+v, want drop ALL and add none", name, c.Name, sc.Capabilities)
			}
			if spec.SecurityContext == nil || spec.SecurityContext.SeccompProfile == nil || spec.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("%s: seccomp profile is not RuntimeDefault", name)
			}
			if name == "plugin" {
				// Root, for the host paths; nothing else.
				if sc.RunAsUser == nil || *sc.RunAsUser != 0 {
					t.Errorf("plugin runs as %v, want 0 (root-owned host paths)", sc.RunAsUser)
				}
				continue
			}
			if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != 65532 {
				t.Errorf("%s/%s: must run as non-root 65532", name, c.Name)
			}
		}
		for _, v := range spec.Volumes {
			if v.HostPath != nil && name != "plugin" {
				t.Errorf("%s mounts host path %s", name, v.HostPath.Path)
			}
		}
	}
	// Which host paths the plugin mounts: TestPluginHostDirectories.
}

func mapsKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestWebhookCertModes checks what each certs.mode wires together: flags, the served Secret, and
// where the API server gets the CA from.
func TestWebhookCertModes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		extraAPIs  []string
		sets       []string
		wantFlags  []string
		wantVolume string // Secret mounted at the cert dir; "" = emptyDir
		wantInject bool
		wantCA     string
	}{
		{name: "auto-without-cert-manager", wantFlags: []string{"--cert-mode=self", "--cert-secret=gpu-dra-webhook-tls", "--webhook-service=gpu-dra-webhook", "--validating-webhook-config=gpu-dra-webhook", "--mutating-webhook-config=gpu-dra-webhook"}},
		{name: "auto-with-cert-manager", extraAPIs: []string{"cert-manager.io/v1"}, wantFlags: []string{"--cert-mode=file"}, wantVolume: "gpu-dra-webhook-tls", wantInject: true},
		{name: "self-with-cert-manager", extraAPIs: []string{"cert-manager.io/v1"}, sets: []string{"certs.mode=self"}, wantFlags: []string{"--cert-mode=self"}},
		{name: "secret", sets: []string{"certs.mode=secret", "certs.secret.name=mine", "certs.secret.caBundle=Q0EK"}, wantFlags: []string{"--cert-mode=file"}, wantVolume: "mine", wantCA: "Q0EK"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRender(t, capabilities(t, clusters[1], tc.extraAPIs...), values(t, tc.sets...))
			m, _ := r.find("Deployment", "gpu-dra-webhook")
			var d appsv1.Deployment
			decode(t, m, &d)
			cmd := d.Spec.Template.Spec.Containers[0].Command
			for _, f := range tc.wantFlags {
				if !slices.Contains(cmd, f) {
					t.Errorf("webhook command %v lacks %s", cmd, f)
				}
			}
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.Name != "serving-certs" {
					continue
				}
				switch {
				case tc.wantVolume == "" && v.EmptyDir == nil:
					t.Errorf("cert dir is %+v, want an emptyDir the webhook fills", v.VolumeSource)
				case tc.wantVolume != "" && (v.Secret == nil || v.Secret.SecretName != tc.wantVolume):
					t.Errorf("cert dir is %+v, want Secret %s", v.VolumeSource, tc.wantVolume)
				}
			}
			_, hasSecret := r.find("Secret", "gpu-dra-webhook-tls")
			wantSecret := slices.Contains(tc.wantFlags, "--cert-mode=self")
			if hasSecret != wantSecret {
				t.Errorf("chart-owned Secret rendered = %v, want %v (self mode only)", hasSecret, wantSecret)
			}
			// Only self mode lets the webhook write its configurations, and only their caBundle.
			if _, hasPolicy := r.find("ValidatingAdmissionPolicy", "gpu-dra-webhook-cabundle-only"); hasPolicy != wantSecret {
				t.Errorf("caBundle-only admission policy rendered = %v, want %v (self mode only)", hasPolicy, wantSecret)
			}
			for _, kind := range []string{"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"} {
				wc, _ := r.find(kind, "gpu-dra-webhook")
				ann, _ := wc.Obj["metadata"].(map[string]any)["annotations"].(map[string]any)
				if got := ann["cert-manager.io/inject-ca-from"]; tc.wantInject != (got == "gpu-dra/gpu-dra-webhook") {
					t.Errorf("%s inject-ca-from = %v, want injection %v", kind, got, tc.wantInject)
				}
				for _, w := range wc.Obj["webhooks"].([]any) {
					ca, _ := w.(map[string]any)["clientConfig"].(map[string]any)["caBundle"].(string)
					if ca != tc.wantCA {
						t.Errorf("%s caBundle = %q, want %q", kind, ca, tc.wantCA)
					}
				}
			}
		})
	}
}

// TestCertManagerObjects decodes the cert-manager objects into cert-manager's own API types and
// follows the chain: self-signed Issuer → CA Certificate → CA Issuer → serving Certificate for the
// names certs.DNSNames gives, stored in the Secret the webhook mounts.
func TestCertManagerObjects(t *testing.T) {
	r := mustRender(t, capabilities(t, clusters[1], "cert-manager.io/v1"), values(t, "certs.mode=cert-manager"))
	issuers := map[string]cmapi.Issuer{}
	certsByName := map[string]cmapi.Certificate{}
	for _, m := range r.Manifests {
		switch m.kind() {
		case cmapi.IssuerKind:
			var o cmapi.Issuer
			decode(t, m, &o)
			issuers[o.Name] = o
		case cmapi.CertificateKind:
			var o cmapi.Certificate
			decode(t, m, &o)
			certsByName[o.Name] = o
		}
	}
	serving, ok := certsByName["gpu-dra-webhook"]
	if !ok {
		t.Fatalf("no serving Certificate gpu-dra-webhook; have %v", slices.Collect(mapsKeys(certsByName)))
	}
	if want := certs.DNSNames("gpu-dra-webhook", releaseNS); !slices.Equal(serving.Spec.DNSNames, want) {
		t.Errorf("serving dnsNames = %v, want %v", serving.Spec.DNSNames, want)
	}
	if serving.Spec.SecretName != "gpu-dra-webhook-tls" || serving.Spec.IsCA {
		t.Errorf("serving Certificate: secretName %s isCA %v", serving.Spec.SecretName, serving.Spec.IsCA)
	}
	caIssuer, ok := issuers[serving.Spec.IssuerRef.Name]
	if !ok || caIssuer.Spec.CA == nil {
		t.Fatalf("serving Certificate's issuer %s is not a CA Issuer", serving.Spec.IssuerRef.Name)
	}
	var ca cmapi.Certificate
	for _, c := range certsByName {
		if c.Spec.SecretName == caIssuer.Spec.CA.SecretName {
			ca = c
		}
	}
	if !ca.Spec.IsCA {
		t.Fatalf("CA Issuer's Secret %s is not issued by a CA Certificate", caIssuer.Spec.CA.SecretName)
	}
	if root, ok := issuers[ca.Spec.IssuerRef.Name]; !ok || root.Spec.SelfSigned == nil {
		t.Errorf("CA Certificate's issuer %s is not self-signed", ca.Spec.IssuerRef.Name)
	}
	if serving.Spec.Duration == nil || ca.Spec.Duration == nil || serving.Spec.Duration.Duration >= ca.Spec.Duration.Duration {
		t.Errorf("serving certificate must not outlive its CA")
	}
}
