// Package cdi writes and removes the CDI spec of each prepared claim. One spec file per claim, named
// after the claim UID, so that unprepare (possibly in another plugin instance) finds exactly its file,
// and a spec can be traced back to its claim when the plugin reconciles after a crash.
package cdi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdiparser "tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// DefaultRoot is where container runtimes look for CDI specs by default.
const DefaultRoot = "/var/run/cdi"

// Class is the CDI class of every device this driver hands out.
const Class = "gpu"

// Annotation keys on a spec; they carry what is needed to rebuild a checkpoint entry from a spec.
const (
	annotationClaimUID       = "claim-uid"
	annotationClaimNamespace = "claim-namespace"
	annotationClaimName      = "claim-name"
	annotationRequest        = "request"
	annotationPool           = "pool"
	annotationDevice         = "device"
	annotationAdminAccess    = "admin-access"
)

// Sharing is how a device is shared, rendered as environment variables.
type Sharing struct {
	Strategy          string `json:"strategy"`
	TimeSliceInterval string `json:"timeSliceInterval,omitempty"`
	PartitionCount    int    `json:"partitionCount,omitempty"`
}

// Device is one allocated device of a claim.
type Device struct {
	// Request is the request (or request/subrequest) it was allocated for.
	Request string `json:"request"`
	Pool    string `json:"pool"`
	// Name is the device name in the pool, gpu-<index>.
	Name    string  `json:"name"`
	Index   int     `json:"index"`
	Sharing Sharing `json:"sharing"`
	// AdminAccess devices may be in use by other claims at the same time (monitoring, debugging).
	AdminAccess bool `json:"adminAccess,omitempty"`
}

// Claim is what a spec is built from.
type Claim struct {
	UID       types.UID `json:"uid"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	Devices   []Device  `json:"devices"`
}

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

// DeviceID is the qualified CDI device name of one device of a claim. The claim UID makes it unique
// so a runtime's cached spec of an earlier claim never matches.
func (w *Writer) DeviceID(claimUID types.UID, deviceName string) string {
	return cdiparser.QualifiedName(w.vendor, Class, cdiDeviceName(claimUID, deviceName))
}

// SpecPath is the file of a claim's spec.
func (w *Writer) SpecPath(claimUID types.UID) string {
	return filepath.Join(w.root, w.specName(claimUID)+".json")
}

func (w *Writer) specName(claimUID types.UID) string {
	return cdiapi.GenerateTransientSpecName(w.vendor, Class, string(claimUID))
}

func cdiDeviceName(claimUID types.UID, deviceName string) string {
	return string(claimUID) + "-" + deviceName
}

// Spec builds the spec of a claim: one CDI device per allocated device, each setting
// GPU_DEVICE_<index> and its claim and sharing variables.
func (w *Writer) Spec(claim Claim) *cdispec.Spec {
	spec := &cdispec.Spec{
		Kind: w.Kind(),
		Annotations: map[string]string{
			annotationClaimUID:       string(claim.UID),
			annotationClaimNamespace: claim.Namespace,
			annotationClaimName:      claim.Name,
		},
	}
	for _, d := range claim.Devices {
		prefix := fmt.Sprintf("GPU_DEVICE_%d", d.Index)
		env := []string{
			prefix + "=" + d.Name,
			prefix + "_RESOURCE_CLAIM=" + string(claim.UID),
			prefix + "_SHARING_STRATEGY=" + d.Sharing.Strategy,
		}
		if d.Sharing.TimeSliceInterval != "" {
			env = append(env, prefix+"_TIMESLICE_INTERVAL="+d.Sharing.TimeSliceInterval)
		}
		if d.Sharing.PartitionCount > 0 {
			env = append(env, fmt.Sprintf("%s_PARTITION_COUNT=%d", prefix, d.Sharing.PartitionCount))
		}
		annotations := map[string]string{
			annotationRequest: d.Request,
			annotationPool:    d.Pool,
			annotationDevice:  d.Name,
		}
		if d.AdminAccess {
			annotations[annotationAdminAccess] = "true"
		}
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name:           cdiDeviceName(claim.UID, d.Name),
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
	return spec
}

// Write writes the claim's spec atomically (temp file and rename, by the CDI library).
func (w *Writer) Write(claim Claim) error {
	if err := w.cache.WriteSpec(w.Spec(claim), w.specName(claim.UID)+".json"); err != nil {
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

// Read rebuilds the claim a spec was written for, from the spec's annotations. Only needed when the
// checkpoint is lost: then the specs are the record of what is prepared.
func (w *Writer) Read(claimUID types.UID) (Claim, error) {
	path := w.SpecPath(claimUID)
	data, err := os.ReadFile(path)
	if err != nil {
		return Claim{}, fmt.Errorf("read CDI spec %s: %w", path, err)
	}
	spec, err := cdiapi.ParseSpec(data)
	if err != nil {
		return Claim{}, fmt.Errorf("parse CDI spec %s: %w", path, err)
	}
	if spec.Kind != w.Kind() {
		return Claim{}, fmt.Errorf("CDI spec %s: kind %q is not %q", path, spec.Kind, w.Kind())
	}
	claim := Claim{
		UID:       types.UID(spec.Annotations[annotationClaimUID]),
		Namespace: spec.Annotations[annotationClaimNamespace],
		Name:      spec.Annotations[annotationClaimName],
	}
	if claim.UID != claimUID || claim.Name == "" {
		return Claim{}, fmt.Errorf("CDI spec %s: annotations do not name claim %s", path, claimUID)
	}
	for _, d := range spec.Devices {
		dev := Device{Request: d.Annotations[annotationRequest], Pool: d.Annotations[annotationPool], Name: d.Annotations[annotationDevice],
			AdminAccess: d.Annotations[annotationAdminAccess] == "true"}
		if dev.Name == "" || dev.Pool == "" {
			return Claim{}, errors.New("CDI spec " + path + ": device " + d.Name + " lacks pool or device annotation")
		}
		if _, err := fmt.Sscanf(dev.Name, "gpu-%d", &dev.Index); err != nil {
			return Claim{}, fmt.Errorf("CDI spec %s: device %q is not gpu-<index>", path, dev.Name)
		}
		prefix := fmt.Sprintf("GPU_DEVICE_%d_", dev.Index)
		for _, e := range d.ContainerEdits.Env {
			k, v, _ := strings.Cut(e, "=")
			switch k {
			case prefix + "SHARING_STRATEGY":
				dev.Sharing.Strategy = v
			case prefix + "TIMESLICE_INTERVAL":
				dev.Sharing.TimeSliceInterval = v
			case prefix + "PARTITION_COUNT":
				_, _ = fmt.Sscanf(v, "%d", &dev.Sharing.PartitionCount)
			}
		}
		claim.Devices = append(claim.Devices, dev)
	}
	return claim, nil
}
