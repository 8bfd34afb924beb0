package charttest

import (
	"os"
	"testing"

	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

func TestMain(m *testing.M) {
	// envtest logs through controller-runtime; without a logger it prints a warning with a stack.
	ctrllog.SetLogger(klog.Background())
	os.Exit(m.Run())
}
