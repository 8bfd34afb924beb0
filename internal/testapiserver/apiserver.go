// Package testapiserver is a test library: it starts a real etcd and kube-apiserver
// (controller-runtime's envtest) from the binaries the harness builds, for integration tests that
// need the API server but no node. Only _test.go files import it.
package testapiserver

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// AssetsEnv names the directory holding kube-apiserver, etcd and kubectl (`make envtest-assets`).
const AssetsEnv = "KUBEBUILDER_ASSETS"

// ReleasesEnv names the directory holding one assets directory per Kubernetes release,
// v<release> (e.g. v1.32.13), for tests that run on several releases. It defaults to the harness
// cache's envtest directory ($GPU_DRA_CACHE/envtest, else ~/.cache/gpu-dra/envtest), where
// `make integration` prepares them.
const ReleasesEnv = "GPU_DRA_ENVTEST_RELEASES"

// Oldest is the runtime config of the oldest release's server (1.32, which knows no later
// resource.k8s.io version than v1beta1): what the seed's cluster ran with.
const Oldest = "resource.k8s.io/v1beta1=true"

// V1Beta1Only is the runtime config of a 1.32-like server of a later release: resource.k8s.io
// served as v1beta1 only (a 1.32 server refuses it: it knows no v1).
const V1Beta1Only = "resource.k8s.io/v1=false,resource.k8s.io/v1beta2=false,resource.k8s.io/v1beta1=true"

// AllVersions serves every resource.k8s.io version the binary knows.
const AllVersions = "resource.k8s.io/v1=true,resource.k8s.io/v1beta2=true,resource.k8s.io/v1beta1=true"

type options struct {
	assetsDir     string
	runtimeConfig string
	featureGates  string
	webhooks      envtest.WebhookInstallOptions
	etcdDataDir   string
}

// Option configures the server.
type Option func(*options)

// WithAssetsDir runs the binaries of dir (see ReleaseAssetsDir) instead of those of AssetsDir.
func WithAssetsDir(dir string) Option { return func(o *options) { o.assetsDir = dir } }

// WithRuntimeConfig passes --runtime-config, e.g. V1Beta1Only.
func WithRuntimeConfig(rc string) Option { return func(o *options) { o.runtimeConfig = rc } }

// WithFeatureGates passes --feature-gates.
func WithFeatureGates(fg string) Option { return func(o *options) { o.featureGates = fg } }

// WithWebhooks installs webhook configurations that point at a local server (envtest generates its
// serving certificate; read LocalServingCertDir/Host/Port from Server.Env.WebhookInstallOptions).
func WithWebhooks(w envtest.WebhookInstallOptions) Option { return func(o *options) { o.webhooks = w } }

// WithEtcdDataDir keeps etcd's data in dir, which outlives the server: a server started later on
// the same dir finds what this one stored, as after a control-plane upgrade.
func WithEtcdDataDir(dir string) Option { return func(o *options) { o.etcdDataDir = dir } }

// Server is a running control plane.
type Server struct {
	Env       *envtest.Environment
	Config    *rest.Config
	Clientset kubernetes.Interface

	stop sync.Once
}

// AssetsDir returns the binaries' directory. Without it a test skips loudly, except in CI (CI=true),
// where a missing API server is a failure: a skipped integration test there is a test that does
// not exist.
func AssetsDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(AssetsEnv)
	if dir == "" || !hasBinaries(dir) {
		missing(t, "needs a real kube-apiserver and etcd: set "+AssetsEnv+" (run `make envtest-assets`, or use `make test`)")
	}
	return dir
}

// ReleaseAssetsDir returns the binaries' directory of one Kubernetes release ("1.32.13"), for tests
// that run on several. A missing release skips loudly, or fails in CI, as in AssetsDir.
func ReleaseAssetsDir(t testing.TB, release string) string {
	t.Helper()
	root := os.Getenv(ReleasesEnv)
	if root == "" {
		root = filepath.Join(cacheDir(), "envtest")
	}
	dir := filepath.Join(root, "v"+release)
	if !hasBinaries(dir) {
		missing(t, "needs kube-apiserver and etcd of Kubernetes "+release+" in "+dir+" (run `make integration`, or "+
			"`K8S_VERSION="+release+" K8S_BINARIES=kube-apiserver e2e/cluster/envtest-assets.sh`; "+ReleasesEnv+" moves the root)")
	}
	return dir
}

// ReleaseBinary returns a binary of one Kubernetes release that envtest does without, e.g.
// kube-controller-manager: from the release's assets directory, else from the local cluster's
// build ($GPU_DRA_CACHE/k8s/v<release>/bin). A missing binary skips loudly, or fails in CI.
func ReleaseBinary(t testing.TB, release, name string) string {
	t.Helper()
	candidates := []string{
		filepath.Join(ReleaseAssetsDir(t, release), name),
		filepath.Join(cacheDir(), "k8s", "v"+release, "bin", name),
	}
	for _, c := range candidates {
		if _, err := os.Stat(c); err == nil {
			return c
		}
	}
	missing(t, "needs "+name+" of Kubernetes "+release+" in "+candidates[0]+" or "+candidates[1]+
		" (`K8S_BINARIES=\"kube-apiserver "+name+"\" K8S_VERSION="+release+" e2e/cluster/envtest-assets.sh`)")
	return ""
}

// ToolBinary returns a tool the harness installs into its cache (`make deps`: e.g. promtool), from
// PATH or $GPU_DRA_CACHE/tools/bin. A missing tool skips loudly, or fails in CI.
func ToolBinary(t testing.TB, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	p := filepath.Join(cacheDir(), "tools", "bin", name)
	if _, err := os.Stat(p); err != nil {
		missing(t, "needs "+name+" in "+p+" (`make deps`)")
	}
	return p
}

// cacheDir is the harness cache: $GPU_DRA_CACHE, else ~/.cache/gpu-dra.
func cacheDir() string {
	if cache := os.Getenv("GPU_DRA_CACHE"); cache != "" {
		return cache
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "gpu-dra")
}

func hasBinaries(dir string) bool {
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return false
		}
	}
	return true
}

func missing(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip("SKIPPED: " + msg)
}

// Minor is the minor version ("1.34") of the kube-apiserver in AssetsDir, for tests whose
// expectations differ by release.
func Minor(t testing.TB) string {
	t.Helper()
	return MinorOf(t, AssetsDir(t))
}

// MinorOf is the minor version of the kube-apiserver in dir.
func MinorOf(t testing.TB, dir string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(dir, "kube-apiserver"), "--version").Output()
	if err != nil {
		t.Fatalf("kube-apiserver --version: %v", err)
	}
	m := regexp.MustCompile(`v1\.(\d+)\.`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("kube-apiserver --version: %q", out)
	}
	return "1." + string(m[1])
}

var setLogger sync.Once

// Start runs etcd and kube-apiserver for the test and stops them in t.Cleanup.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	// envtest (and managers under test) log through controller-runtime; without a logger it prints
	// a warning with a stack trace.
	setLogger.Do(func() { ctrllog.SetLogger(klog.Background()) })
	o := options{runtimeConfig: AllVersions}
	for _, opt := range opts {
		opt(&o)
	}
	if o.assetsDir == "" {
		o.assetsDir = AssetsDir(t)
	}
	// The binaries' paths are set, not left to BinaryAssetsDirectory: envtest prefers
	// $KUBEBUILDER_ASSETS to it, which would run the default release where a test asked for another.
	env := &envtest.Environment{
		BinaryAssetsDirectory: o.assetsDir,
		WebhookInstallOptions: o.webhooks,
		ControlPlane: envtest.ControlPlane{
			APIServer: &envtest.APIServer{Path: filepath.Join(o.assetsDir, "kube-apiserver")},
			Etcd:      &envtest.Etcd{Path: filepath.Join(o.assetsDir, "etcd"), DataDir: o.etcdDataDir},
		},
	}
	args := env.ControlPlane.GetAPIServer().Configure()
	if o.runtimeConfig != "" {
		args.Set("runtime-config", o.runtimeConfig)
	}
	if o.featureGates != "" {
		args.Set("feature-gates", o.featureGates)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start kube-apiserver (runtime-config %q): %v", o.runtimeConfig, err)
	}
	s := &Server{Env: env, Config: cfg}
	t.Cleanup(func() { s.Stop(t) })
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("clientset: %v", err)
	}
	s.Clientset = cs
	return s
}

// Stop stops kube-apiserver and etcd before the test ends, e.g. to start another release on the
// same WithEtcdDataDir; stopping twice is harmless.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.stop.Do(func() {
		if err := s.Env.Stop(); err != nil {
			t.Logf("stop kube-apiserver: %v", err)
		}
	})
}

// EtcdEndpoint is the URL of the server's etcd, for tests that read what the API server stored.
func (s *Server) EtcdEndpoint() string {
	return s.Env.ControlPlane.Etcd.URL.String()
}

// ServedResourceVersions lists the resource.k8s.io versions the server serves, newest first.
func (s *Server) ServedResourceVersions(t testing.TB) []string {
	t.Helper()
	served, err := resourceversion.Served(s.Clientset.Discovery())
	if err != nil {
		t.Fatal(err)
	}
	return served
}
