package migrate_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// controllerManager returns the kube-controller-manager of a release: next to its envtest
// binaries, or where the local cluster's build leaves it ($GPU_DRA_CACHE/k8s/v<release>/bin).
// Without it the test skips loudly, or fails in CI.
func controllerManager(t *testing.T, release string) string {
	t.Helper()
	candidates := []string{filepath.Join(testapiserver.ReleaseAssetsDir(t, release), "kube-controller-manager")}
	cache := os.Getenv("GPU_DRA_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "gpu-dra")
	}
	candidates = append(candidates, filepath.Join(cache, "k8s", "v"+release, "bin", "kube-controller-manager"))
	for _, c := range candidates {
		if _, err := os.Stat(c); err == nil {
			return c
		}
	}
	msg := "needs kube-controller-manager of Kubernetes " + release + " in one of " + candidates[0] + ", " + candidates[1] +
		" (`K8S_VERSION=" + release + " K8S_BINARIES=kube-controller-manager e2e/cluster/envtest-assets.sh`)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip("SKIPPED: " + msg)
	return ""
}

// startControllerManager runs only the controllers a StorageVersionMigration needs against srv:
// the migrator and the garbage collector, whose resource monitors it reads.
func startControllerManager(t *testing.T, binary string, srv *testapiserver.Server) {
	t.Helper()
	cfg := srv.Config
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	kc.CurrentContext = "envtest"
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "kube-controller-manager.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "--kubeconfig", kubeconfig, "--leader-elect=false", "--secure-port=0",
		"--controllers=garbage-collector-controller,storage-version-migrator-controller")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = log.Close()
		if t.Failed() {
			out, _ := os.ReadFile(log.Name())
			t.Logf("kube-controller-manager, its lines about migrations and errors:\n%s", relevant(out))
		}
	})
}

// relevant keeps the log lines of the migrator and of errors, at most 100 of them.
func relevant(log []byte) string {
	var keep []string
	for line := range strings.Lines(string(log)) {
		if strings.Contains(line, "migrat") || strings.Contains(line, "E1") || strings.Contains(strings.ToLower(line), "error") {
			keep = append(keep, line)
		}
	}
	if len(keep) > 100 {
		keep = keep[len(keep)-100:]
	}
	return strings.Join(keep, "")
}
