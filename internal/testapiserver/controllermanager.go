package testapiserver

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// StartControllerManager runs the kube-controller-manager binary against s with args (e.g.
// --controllers=... and --feature-gates=...) until the test ends; when the test failed it shows
// the log's lines that contain keyword or an error.
func (s *Server) StartControllerManager(t testing.TB, binary, keyword string, args ...string) {
	t.Helper()
	cfg := s.Config
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
	cmd := exec.Command(binary, append([]string{"--kubeconfig", kubeconfig, "--leader-elect=false", "--secure-port=0"}, args...)...)
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
			t.Logf("kube-controller-manager, its lines about %s and errors:\n%s", keyword, relevantLines(out, keyword))
		}
	})
}

// relevantLines keeps the log lines that contain keyword or an error, at most the last 100.
func relevantLines(log []byte, keyword string) string {
	var keep []string
	for line := range strings.Lines(string(log)) {
		if strings.Contains(line, keyword) || strings.Contains(line, "E1") || strings.Contains(strings.ToLower(line), "error") {
			keep = append(keep, line)
		}
	}
	if len(keep) > 100 {
		keep = keep[len(keep)-100:]
	}
	return strings.Join(keep, "")
}
