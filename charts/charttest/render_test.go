// Package charttest renders charts/gpu-dra with the Helm SDK as `helm lint`, `helm template` and
// `helm install` would, for the Kubernetes versions the chart supports, and checks the output
// against golden files, the Kubernetes OpenAPI schemas of each version, and a real API server.
package charttest

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	"helm.sh/helm/v4/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/hack/buildenv"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current chart")

const (
	chartDir    = "../gpu-dra"
	releaseName = "gpu-dra"
	releaseNS   = "gpu-dra"
)

// cluster is a Kubernetes minor version as the chart sees it through .Capabilities.
type cluster struct {
	name string
	// kubeVersion is also the k8s.io/kubernetes module whose OpenAPI specs validate the output.
	kubeVersion string
	// resourceVersions are the resource.k8s.io versions the cluster serves (SPEC §2).
	resourceVersions []string
	// wantResourceAPI is what the chart must pick.
	wantResourceAPI string
}

// The tested releases (hack/buildenv), as Helm spells a cluster's version.
var (
	kubeOldest = "v" + buildenv.Oldest
	kubeSeed   = "v" + buildenv.Seed
	kubeNewest = "v" + buildenv.Newest
)

var clusters = []cluster{
	{"k8s-1.32", kubeOldest, []string{"v1beta1"}, "resource.k8s.io/v1beta1"},
	{"k8s-1.34", kubeSeed, []string{"v1", "v1beta1"}, "resource.k8s.io/v1"},
	{"k8s-1.37", kubeNewest, []string{"v1"}, "resource.k8s.io/v1"},
}

// baseAPIVersions are the GA group versions every supported cluster serves that the chart uses.
var baseAPIVersions = []string{
	"v1", "apps/v1", "batch/v1", "policy/v1", "rbac.authorization.k8s.io/v1",
	"admissionregistration.k8s.io/v1", "coordination.k8s.io/v1", "apiextensions.k8s.io/v1",
}

func capabilities(t testing.TB, c cluster, extraAPIs ...string) *common.Capabilities {
	t.Helper()
	kv, err := common.ParseKubeVersion(c.kubeVersion)
	if err != nil {
		t.Fatalf("kube version %s: %v", c.kubeVersion, err)
	}
	apis := slices.Clone(baseAPIVersions)
	for _, v := range c.resourceVersions {
		apis = append(apis, "resource.k8s.io/"+v)
	}
	apis = append(apis, extraAPIs...)
	caps := common.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv
	caps.APIVersions = apis
	return caps
}

// values parses `--set` style assignments, as the helm CLI does.
func values(t testing.TB, sets ...string) map[string]any {
	t.Helper()
	vals := map[string]any{}
	for _, s := range sets {
		if err := strvals.ParseInto(s, vals); err != nil {
			t.Fatalf("--set %s: %v", s, err)
		}
	}
	return vals
}

func loadChart(t testing.TB) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart %s: %v", chartDir, err)
	}
	return ch
}

// manifest is one rendered YAML document.
type manifest struct {
	Source string
	YAML   string
	Obj    map[string]any
}

func (m manifest) kind() string { s, _ := m.Obj["kind"].(string); return s }
func (m manifest) apiVersion() string {
	s, _ := m.Obj["apiVersion"].(string)
	return s
}
func (m manifest) name() string {
	md, _ := m.Obj["metadata"].(map[string]any)
	s, _ := md["name"].(string)
	return s
}

// rendered is the chart's output: the manifests in a stable order, and NOTES.txt.
type rendered struct {
	Manifests []manifest
	Notes     string
}

// render is `helm template` with exact capabilities: unlike the CLI, whose client-only mode
// always adds every API version client-go knows, this lets a test be a 1.32 cluster.
func render(t testing.TB, caps *common.Capabilities, vals map[string]any) (rendered, error) {
	t.Helper()
	ch := loadChart(t)
	opts := common.ReleaseOptions{Name: releaseName, Namespace: releaseNS, Revision: 1, IsInstall: true}
	rv, err := util.ToRenderValuesWithSchemaValidation(ch, vals, opts, caps, false)
	if err != nil {
		return rendered{}, err
	}
	files, err := engine.Render(ch, rv)
	if err != nil {
		return rendered{}, err
	}
	var out rendered
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") {
			out.Notes = files[name]
			continue
		}
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		for _, doc := range splitDocs(files[name]) {
			var obj map[string]any
			if err := yaml.UnmarshalStrict([]byte(doc), &obj); err != nil {
				t.Fatalf("%s: not YAML: %v\n%s", name, err, doc)
			}
			if obj == nil {
				continue
			}
			out.Manifests = append(out.Manifests, manifest{Source: name, YAML: doc, Obj: obj})
		}
	}
	return out, nil
}

func mustRender(t testing.TB, caps *common.Capabilities, vals map[string]any) rendered {
	t.Helper()
	r, err := render(t, caps, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return r
}

func splitDocs(s string) []string {
	var docs []string
	for _, d := range strings.Split("\n"+s, "\n---") {
		d = strings.TrimSpace(d)
		// Drop documents that are only comments.
		empty := true
		for _, line := range strings.Split(d, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				empty = false
				break
			}
		}
		if !empty {
			docs = append(docs, d)
		}
	}
	return docs
}

func (r rendered) find(kind, name string) (manifest, bool) {
	for _, m := range r.Manifests {
		if m.kind() == kind && (name == "" || m.name() == name) {
			return m, true
		}
	}
	return manifest{}, false
}

// webhookContainer is the webhook Deployment's webhook container as rendered.
func (r rendered) webhookContainer(t testing.TB) corev1.Container {
	t.Helper()
	m, ok := r.find("Deployment", "gpu-dra-webhook")
	if !ok {
		t.Fatal("no webhook Deployment")
	}
	var dep appsv1.Deployment
	decode(t, m, &dep)
	for _, c := range dep.Spec.Template.Spec.Containers {
		if c.Name == "webhook" {
			return c
		}
	}
	t.Fatal("no webhook container in the webhook Deployment")
	return corev1.Container{}
}

func (r rendered) golden() string {
	var b strings.Builder
	for _, m := range r.Manifests {
		b.WriteString("---\n# Source: " + m.Source + "\n" + m.YAML + "\n")
	}
	b.WriteString("--- NOTES.txt\n" + r.Notes + "\n")
	return b.String()
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run `go test ./charts/charttest -run %s -update` to create it)", err, t.Name())
	}
	if string(want) != got {
		t.Errorf("%s differs from the rendered chart; review, then regenerate with -update.\n%s", path, diffLines(string(want), got))
	}
}

// diffLines shows the first differing lines, enough to see what changed.
func diffLines(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < len(al) || i < len(bl); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return "line " + itoa(i+1) + ":\n- " + x + "\n+ " + y
		}
	}
	return ""
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

// installSets is the single-node install of the e2e harness (images imported, never pulled).
var installSets = []string{"image.repository=" + buildenv.ImageRepository, "image.tag=" + buildenv.ImageTag, "image.pullPolicy=Never"}

// goldenCases are the renderings kept in testdata: one per supported cluster, plus each
// certificate mode and the version override.
func goldenCases() []struct {
	name  string
	c     cluster
	extra []string
	sets  []string
} {
	type tc = struct {
		name  string
		c     cluster
		extra []string
		sets  []string
	}
	var out []tc
	for _, c := range clusters {
		out = append(out, tc{name: c.name, c: c, sets: installSets})
	}
	out = append(out,
		tc{name: "k8s-1.34-cert-manager", c: clusters[1], extra: []string{"cert-manager.io/v1"}, sets: installSets},
		tc{name: "k8s-1.37-secret", c: clusters[2], sets: append(slices.Clone(installSets),
			"certs.mode=secret", "certs.secret.name=my-webhook-tls", "certs.secret.caBundle=Q0EK",
			"webhook.deny={missing-class,deprecated-version}", "webhook.failurePolicy=Ignore")},
		tc{name: "k8s-1.34-override-v1beta2", c: clusters[1], sets: append(slices.Clone(installSets),
			"resourceApiVersion=v1beta2", "inventory.nodeGroups[0].name=small",
			"inventory.nodeGroups[0].nodeSelector.gpu\\.example\\.com/group=small",
			"inventory.nodeGroups[0].count=4", "inventory.nodeGroups[0].memory=40Gi",
			"cleanup.enabled=false", "admissionPolicy.enabled=false")},
	)
	return out
}

func TestGolden(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRender(t, capabilities(t, tc.c, tc.extra...), values(t, tc.sets...))
			checkGolden(t, tc.name, r.golden())
		})
	}
}

// BenchmarkRender is one `helm template` of the chart for a 1.34 cluster.
func BenchmarkRender(b *testing.B) {
	caps := capabilities(b, clusters[1])
	vals := values(b, installSets...)
	for b.Loop() {
		if _, err := render(b, caps, vals); err != nil {
			b.Fatal(err)
		}
	}
}

// TestImageRepository: the chart's default image is the one `make images` builds and the e2e suite
// installs (hack/buildenv).
func TestImageRepository(t *testing.T) {
	image, _ := loadChart(t).Values["image"].(map[string]any)
	if got := image["repository"]; got != buildenv.ImageRepository {
		t.Errorf("values.yaml image.repository = %v; hack/buildenv/build.env builds %s", got, buildenv.ImageRepository)
	}
}
