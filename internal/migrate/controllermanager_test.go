package migrate_test

import (
	"testing"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// startControllerManager runs only the controllers a StorageVersionMigration needs against srv:
// the migrator and the garbage collector, whose resource monitors it reads.
func startControllerManager(t *testing.T, binary string, srv *testapiserver.Server) {
	t.Helper()
	testapiserver.RunComponent(t, binary, []string{"migrat"}, "--kubeconfig", srv.Kubeconfig(t), "--leader-elect=false", "--secure-port=0",
		"--controllers=garbage-collector-controller,storage-version-migrator-controller")
}
