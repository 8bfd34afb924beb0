package app

import (
	"testing"

	"k8s.io/client-go/rest"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// writeKubeconfig turns the envtest rest.Config into a kubeconfig file, as a user would have.
func writeKubeconfig(t testing.TB, cfg *rest.Config) string {
	t.Helper()
	return testapiserver.WriteKubeconfig(t, cfg)
}
