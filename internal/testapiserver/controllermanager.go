package testapiserver

import "testing"

// StartControllerManager runs the kube-controller-manager binary against s with args (e.g.
// --controllers=... and --feature-gates=...) until the test ends; when the test failed it shows
// the log's lines that contain keyword or an error.
func (s *Server) StartControllerManager(t testing.TB, binary, keyword string, args ...string) {
	t.Helper()
	RunComponent(t, binary, []string{keyword}, append([]string{"--kubeconfig", s.Kubeconfig(t), "--leader-elect=false", "--secure-port=0"}, args...)...)
}
