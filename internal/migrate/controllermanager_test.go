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
