// Package cdi writes and removes the CDI spec of each prepared claim. One spec file per claim, named
// after the claim UID, so that unprepare (possibly in another plugin instance) finds exactly its file.
//
// A spec is rendered from the claim's checkpoint entry and carries that entry in its
// "prepared-claim" annotation: when the checkpoint is lost, Read recovers the entry from there,
// so what the container's environment looks like never decides what the plugin believes is
// prepared.
package cdi

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdiparser "tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

// DefaultRoot is where container runtimes look for CDI specs by default.
const DefaultRoot = "/var/run/cdi"

// Class is the CDI class of every device this driver hands out.
const Class = "gpu"

// annotationPreparedClaim holds the claim's checkpoint entry (checkpoint.EncodeClaim).
const annotationPreparedClaim = "prepared-claim"

// annotationShareID names the share a CDI device is, for whoever reads the spec; recovery takes
// it from the prepared-claim entry.
const annotationShareID = "share-id"

// Writer owns this driver's spec files in one CDI directory.
type Writer struct {
	root   string
	vendor string
	cache  *cdiapi.Cache
}

// NewWriter returns a writer for the driver's vendor (k8s.<driver name>) in root.
func NewWriter(root, driverName string) (*Writer, error) {
	if root == "" {
		root = DefaultRoot
	}
	vendor := "k8s." + driverName
	if err := cdiparser.ValidateVendorName(vendor); err != nil {
		return nil, fmt.Errorf("CDI vendor %q from driver name %q: %w", vendor, driverName, err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI root %s: %w", root, err)
	}
	// Auto-refresh would start an fsnotify watcher and re-parse every spec on each change; this
	// writer never reads through the cache, it only uses its atomic write and remove.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(root), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache for %s: %w", root, err)
	}
	return &Writer{root: root, vendor: vendor, cache: cache}, nil
}

// Kind is the CDI kind, e.g. k8s.gpu.example.com/gpu.
func (w *Writer) Kind() string { return w.vendor + "/" + Class }

// DeviceName is the CDI device name of a newly prepared device. The claim UID makes it unique so
// a runtime's cached spec of an earlier claim never matches.
func DeviceName(claimUID types.UID, deviceName string) string {
	return string(claimUID) + "-" + deviceName
}

// ShareDeviceName is the CDI device name of one share of a device (KEP-5075): the share ID keeps
// two shares of one device in one claim apart, as the reference driver names them.
func ShareDeviceName(claimUID types.UID, deviceName, shareID string) string {
	return DeviceName(claimUID, deviceName) + "-" + shareID
}

// DeviceID is the qualified CDI device name the kubelet hands to the runtime for a device named
// cdiDevice in one of this writer's specs.
func (w *Writer) DeviceID(cdiDevice string) string {
	return cdiparser.QualifiedName(w.vendor, Class, cdiDevice)
}

// SpecPath is the file of a claim's spec.
func (w *Writer) SpecPath(claimUID types.UID) string {
	return filepath.Join(w.root, w.specName(claimUID)+".json")
}

func (w *Writer) specName(claimUID types.UID) string {
	return cdiapi.GenerateTransientSpecName(w.vendor, Class, string(claimUID))
}

// EnvAdminAccess tells a container whether its claim has admin access (KEP-5018), as in the
// upstream reference driver: "true" or "false" on every device, the same for every device of a
// claim (admin access for any request flags the whole claim), so one claim never sets two values.
const EnvAdminAccess = "DRA_ADMIN_ACCESS"

// Spec builds the spec of a claim: one CDI device per allocated device, each setting
// GPU_DEVICE_<id> (deviceschema.EnvID), its claim and sharing variables, and DRA_ADMIN_ACCESS.
func (w *Writer) Spec(claim checkpoint.PreparedClaim) (*cdispec.Spec, error) {
	entry, err := checkpoint.EncodeClaim(claim)
	if err != nil {
		return nil, err
	}
	spec := &cdispec.Spec{
		Kind: w.Kind(),
		Annotations: map[string]string{
			annotationPreparedClaim: entry,
		},
	}
	adminAccess := EnvAdminAccess + "=" + strconv.FormatBool(claim.AdminAccess())
	for _, d := range claim.Devices {
		prefix := "GPU_DEVICE_" + deviceschema.EnvID(d.Device, d.Index)
		env := []string{
			prefix + "=" + d.Device,
			prefix + "_RESOURCE_CLAIM=" + string(claim.UID),
			prefix + "_SHARING_STRATEGY=" + d.Sharing.Strategy,
		}
		if d.Sharing.TimeSliceInterval != "" {
			env = append(env, prefix+"_TIMESLICE_INTERVAL="+d.Sharing.TimeSliceInterval)
		}
		if d.Sharing.PartitionCount > 0 {
			env = append(env, fmt.Sprintf("%s_PARTITION_COUNT=%d", prefix, d.Sharing.PartitionCount))
		}
		// A share's size, as the scheduler allocated it (rounded up to the device's request
		// policy), as the reference driver sets it for shares; a partition's size, which the
		// reference driver leaves out.
		size := d.ConsumedCapacity
		if d.ShareID == "" {
			size = d.Capacity
		}
		if q, ok := size[string(deviceschema.CapMemory)]; ok {
			env = append(env, prefix+"_MEMORY="+q.String())
		}
		if q, ok := size[string(deviceschema.CapCompute)]; ok {
			env = append(env, prefix+"_COMPUTE="+q.String())
		}
		env = append(env, adminAccess)
		var annotations map[string]string
		if d.ShareID != "" {
			annotations = map[string]string{annotationShareID: d.ShareID}
		}
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name:           d.CDIDevice,
			Annotations:    annotations,
			ContainerEdits: cdispec.ContainerEdits{Env: env},
		})
	}
	// The oldest spec version that can express this spec, so older runtimes accept the file.
	if v, err := cdispec.MinimumRequiredVersion(spec); err == nil {
		spec.Version = v
	} else {
		spec.Version = cdispec.CurrentVersion
	}
	return spec, nil
}

// Write writes the claim's spec atomically (temp file and rename, by the CDI library).
func (w *Writer) Write(claim checkpoint.PreparedClaim) error {
	spec, err := w.Spec(claim)
	if err == nil {
		err = w.cache.WriteSpec(spec, w.specName(claim.UID)+".json")
	}
	if err != nil {
		return fmt.Errorf("write CDI spec %s: %w", w.SpecPath(claim.UID), err)
	}
	return nil
}

// Remove deletes the claim's spec; a missing file is not an error (unprepare is idempotent).
func (w *Writer) Remove(claimUID types.UID) error {
	if err := w.cache.RemoveSpec(w.specName(claimUID) + ".json"); err != nil {
		return fmt.Errorf("remove CDI spec %s: %w", w.SpecPath(claimUID), err)
	}
	return nil
}

// Exists reports whether the claim's spec file is present.
func (w *Writer) Exists(claimUID types.UID) bool {
	_, err := os.Stat(w.SpecPath(claimUID))
	return err == nil
}

// List returns the claim UIDs of all specs of this driver in the directory, sorted.
func (w *Writer) List() ([]types.UID, error) {
	prefix := w.specName("")
	entries, err := os.ReadDir(w.root)
	if err != nil {
		return nil, fmt.Errorf("list CDI specs in %s: %w", w.root, err)
	}
	var uids []types.UID
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, ".json") {
			continue
		}
		uids = append(uids, types.UID(strings.TrimSuffix(strings.TrimPrefix(name, prefix), ".json")))
	}
	sort.Slice(uids, func(i, j int) bool { return uids[i] < uids[j] })
	return uids, nil
}

// Read recovers the checkpoint entry a spec was written from. Only needed when the checkpoint is
// lost: then the specs are the record of what is prepared.
func (w *Writer) Read(claimUID types.UID) (checkpoint.PreparedClaim, error) {
	path := w.SpecPath(claimUID)
	data, err := os.ReadFile(path)
	if err != nil {
		return checkpoint.PreparedClaim{}, fmt.Errorf("read CDI spec %s: %w", path, err)
	}
	spec, err := cdiapi.ParseSpec(data)
	if err != nil {
		return checkpoint.PreparedClaim{}, fmt.Errorf("parse CDI spec %s: %w", path, err)
	}
	if spec.Kind != w.Kind() {
		return checkpoint.PreparedClaim{}, fmt.Errorf("CDI spec %s: kind %q is not %q", path, spec.Kind, w.Kind())
	}
	entry, ok := spec.Annotations[annotationPreparedClaim]
	if !ok {
		return checkpoint.PreparedClaim{}, fmt.Errorf("CDI spec %s: no %s annotation; this plugin did not write it", path, annotationPreparedClaim)
	}
	claim, err := checkpoint.DecodeClaim(entry)
	if err != nil {
		return checkpoint.PreparedClaim{}, fmt.Errorf("CDI spec %s: annotation %s: %w", path, annotationPreparedClaim, err)
	}
	if claim.UID != claimUID || claim.Name == "" {
		return checkpoint.PreparedClaim{}, fmt.Errorf("CDI spec %s: annotation %s does not name claim %s", path, annotationPreparedClaim, claimUID)
	}
	return claim, nil
}
