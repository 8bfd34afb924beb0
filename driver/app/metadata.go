package app

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/runtime/schema"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpu-dra/gpu-dra/driver/cdi"
)

// metadataVersions are written into each device metadata file, newest first: v1beta1 is the
// current one (Kubernetes 1.37), v1alpha1 serves readers built against 1.36.
var metadataVersions = []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion, metadatav1alpha1.SchemeGroupVersion}

// deviceMetadataOptions turn on the kubeletplugin helper's device metadata (KEP-5304). It needs no
// feature gate, only a runtime with CDI: the helper writes a file per claim and request and a CDI
// spec, in the CDI directory the runtime reads, that bind-mounts it into the container.
func deviceMetadataOptions(cdiRoot string) []kubeletplugin.Option {
	return []kubeletplugin.Option{
		kubeletplugin.EnableDeviceMetadata(true, metadataVersions),
		kubeletplugin.CDIDirectory(cmp.Or(cdiRoot, cdi.DefaultRoot)),
		kubeletplugin.MetadataFileOps(kubeletplugin.MetadataFileOperations{WriteFile: writeFileAtomically}),
	}
}

// writeFileAtomically replaces name through a temporary file and a rename, so a container or the
// runtime never reads half a file, but without the library's default fsync of file and directory:
// on a node's disk those doubled the prepare's latency (two files per request), and, as with the
// checkpoint, nothing here needs to outlive the boot: after a reboot the plugin removes metadata of
// claims it no longer holds and the kubelet prepares again, which rewrites the files.
func writeFileAtomically(name string, data []byte, perm os.FileMode) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(perm); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	return os.Rename(tmp.Name(), name)
}
