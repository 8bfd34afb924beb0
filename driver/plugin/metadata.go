package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
)

// Device metadata (KEP-5304) is written by the kubeletplugin helper, not by this package: after
// each prepare it writes, per claim and request, a metadata file under the plugin data directory and
// a CDI spec in the CDI directory that bind-mounts the file into the container
// (/var/run/kubernetes.io/dra-device-attributes/...), and it removes both on unprepare. What it does
// not do is notice files of claims that were unprepared while no plugin ran, or whose unprepare
// crashed halfway; RemoveStaleMetadata does. The layout below is the helper's (kubeletplugin
// metadata.go), pinned by the tests that prepare through the real socket.
const (
	// MetadataDir is the helper's directory of metadata files in the plugin data directory, with
	// one subdirectory "<claim namespace>_<claim name>" per prepared claim.
	MetadataDir = "dra-device-metadata"
	// metadataSpecInfix joins the driver name and "<claim UID>_<request>.json" in the names of the
	// helper's metadata CDI specs.
	metadataSpecInfix = "_metadata_"
)

// deviceMetadata is what the device metadata file says about a device: the attributes it
// publishes in its ResourceSlice, as the library recommends.
func deviceMetadata(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) *kubeletplugin.DeviceMetadata {
	if len(attrs) == 0 {
		return nil
	}
	m := &kubeletplugin.DeviceMetadata{Attributes: make(map[string]resourceapi.DeviceAttribute, len(attrs))}
	for name, a := range attrs {
		m.Attributes[string(name)] = a
	}
	return m
}

// MetadataLocation is where the helper keeps device metadata: the plugin data directory and the
// CDI directory it was given (kubeletplugin.PluginDataDirectoryPath and CDIDirectory).
type MetadataLocation struct {
	DataDir, CDIDir string
}

// StaleMetadata is what RemoveStaleMetadata removed.
type StaleMetadata struct {
	// Dirs are claim directories ("<namespace>_<name>") of claims that are not prepared.
	Dirs []string
	// Specs are metadata CDI spec files of claim UIDs that are not prepared.
	Specs []string
}

// RemoveStaleMetadata removes the helper's metadata files and CDI specs of claims the checkpoint
// does not hold, under the same lock as Reconcile: after a crash or a reboot nothing else would.
// Call it after Reconcile, which settles what is prepared. Files of prepared claims stay: the
// kubelet prepares them again after its own restart, and the helper rewrites them then.
func (d *Driver) RemoveStaleMetadata(ctx context.Context, loc MetadataLocation) (*StaleMetadata, error) {
	unlock, err := d.lockState()
	if err != nil {
		return nil, err
	}
	defer unlock()
	data, err := d.loadCheckpoint(ctx)
	if err != nil {
		return nil, err
	}
	stale, err := removeStaleMetadata(d.driverName, loc, data.Claims)
	if n := len(stale.Dirs) + len(stale.Specs); n > 0 || err != nil {
		klog.FromContext(ctx).Info("Removed device metadata of claims that are no longer prepared",
			"dirs", stale.Dirs, "cdiSpecs", stale.Specs, "err", err)
	}
	return stale, err
}

func removeStaleMetadata(driverName string, loc MetadataLocation, prepared map[types.UID]checkpoint.PreparedClaim) (*StaleMetadata, error) {
	byName := make(map[string]bool, len(prepared))
	for _, c := range prepared {
		byName[c.Namespace+"_"+c.Name] = true
	}
	stale := &StaleMetadata{}
	var errs []error
	root := filepath.Join(loc.DataDir, MetadataDir)
	dirs, err := os.ReadDir(root)
	if err != nil && !os.IsNotExist(err) {
		errs = append(errs, fmt.Errorf("list device metadata in %s: %w", root, err))
	}
	for _, e := range dirs {
		if byName[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("remove stale device metadata: %w", err))
			continue
		}
		stale.Dirs = append(stale.Dirs, e.Name())
	}
	// Claim UIDs and request names (DNS labels) contain no "_", so the UID is what lies between
	// the infix and the next "_".
	prefix := driverName + metadataSpecInfix
	specs, err := os.ReadDir(loc.CDIDir)
	if err != nil && !os.IsNotExist(err) {
		errs = append(errs, fmt.Errorf("list CDI specs in %s: %w", loc.CDIDir, err))
	}
	for _, e := range specs {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || e.IsDir() || !strings.HasSuffix(rest, ".json") {
			continue
		}
		uid, _, ok := strings.Cut(rest, "_")
		if !ok {
			continue
		}
		if _, ok := prepared[types.UID(uid)]; ok {
			continue
		}
		if err := os.Remove(filepath.Join(loc.CDIDir, e.Name())); err != nil && !os.IsNotExist(err) {
			errs = append(errs, fmt.Errorf("remove stale device metadata CDI spec: %w", err))
			continue
		}
		stale.Specs = append(stale.Specs, e.Name())
	}
	return stale, errors.Join(errs...)
}
