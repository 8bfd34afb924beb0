package certs

import (
	"os"
	"testing"

	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

func TestMain(m *testing.M) {
	// envtest and the managers log through controller-runtime; give them klog.
	ctrllog.SetLogger(klog.Background())
	os.Exit(m.Run())
}
