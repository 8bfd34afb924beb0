package testapiserver

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Kubeconfig writes a kubeconfig of the server's admin user into a temporary file and returns its
// path, for control-plane binaries run beside the server.
func (s *Server) Kubeconfig(t testing.TB) string {
	t.Helper()
	return WriteKubeconfig(t, s.Config)
}

// WriteKubeconfig turns a rest.Config of an envtest server into a kubeconfig file in a temporary
// directory, as a user or a control-plane binary would have, and returns its path.
func WriteKubeconfig(t testing.TB, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// StartScheduler runs kube-scheduler of the given release (see ReleaseBinary) against the server
// until the test ends, without leader election or a serving port, so that tests that need
// scheduling but no kubelet (Node objects created directly) get the real scheduler's decisions.
// Extra flags follow the defaults, e.g. "--feature-gates=...". Its log lines that keep matches any
// of keep (and error lines) are shown when the test fails, at most 200.
func (s *Server) StartScheduler(t testing.TB, release string, keep []string, flags ...string) {
	t.Helper()
	binary := ReleaseBinary(t, release, "kube-scheduler")
	RunComponent(t, binary, keep, append([]string{"--kubeconfig", s.Kubeconfig(t), "--leader-elect=false", "--secure-port=0"}, flags...)...)
}

// RunComponent runs a control-plane binary (flags included in args) until the test ends; its log
// lines that contain any of keep, and its error lines, are shown when the test fails.
func RunComponent(t testing.TB, binary string, keep []string, args ...string) {
	t.Helper()
	name := filepath.Base(binary)
	log, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = log.Close()
		if t.Failed() {
			out, _ := os.ReadFile(log.Name())
			t.Logf("%s, its lines about %v and errors:\n%s", name, keep, matching(out, keep, 200))
		}
	})
}

// matching keeps the log lines that contain any of keep, or an error, the last max of them.
func matching(log []byte, keep []string, max int) string {
	var out []string
	for line := range strings.Lines(string(log)) {
		if strings.HasPrefix(line, "E1") || strings.Contains(strings.ToLower(line), "error") || containsAny(line, keep) {
			out = append(out, line)
		}
	}
	if len(out) > max {
		out = out[len(out)-max:]
	}
	return strings.Join(out, "")
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
