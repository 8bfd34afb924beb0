package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpu-dra/gpu-dra/driver/simulated"
)

// TestDeviceStatusAndMetadata prepares through the real socket and checks what a user and a
// container get beyond the CDI devices: the claim's status.devices (KEP-4817) and the device
// metadata file (KEP-5304), with both turned off, then on; and that a restart after a crash
// writes the status it missed and removes the metadata of claims that went away meanwhile.
func TestDeviceStatusAndMetadata(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := newCluster(t, v1Only, nil)
	// A claim from a template, as the resourceclaim controller creates it: the container path
	// is named after the pod's claim.
	fromTemplate := c.allocatedClaim(t, ctx, "pod0-gpu-x7k2p", []string{"gpu-1", "gpu-2"})
	fromTemplate.Annotations = map[string]string{resourceapi.PodResourceClaimAnnotation: "gpu"}
	fromTemplate, err := c.claims.ResourceClaims(namespace).Update(ctx, fromTemplate, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	standalone := c.allocatedClaim(t, ctx, "standalone", []string{"gpu-0"})

	// Both off: one CDI ID per device, nothing else written.
	p := c.startPlugin(t, "", "--device-status=false", "--device-metadata=false")
	k := p.register(ctx, false)
	got, err := k.prepare(ctx, fromTemplate)
	if err != nil {
		t.Fatal(err)
	}
	for dev, ids := range got[fromTemplate.UID] {
		if len(ids) != 1 {
			t.Errorf("metadata off: device %s has CDI IDs %v", dev, ids)
		}
	}
	if _, err := os.Stat(filepath.Join(c.dataDir(), "dra-device-metadata")); !os.IsNotExist(err) {
		t.Errorf("metadata off, but its directory exists: %v", err)
	}
	p.kill()

	// Defaults: the claim prepared by the earlier instance gets its status on start, without a
	// prepare; preparing it again (the kubelet after its restart) adds the metadata.
	p = c.startPlugin(t, "")
	k = p.register(ctx, false)
	waitStatus(t, ctx, c, fromTemplate, "gpu-1", "gpu-2")
	got, err = k.prepare(ctx, fromTemplate, standalone)
	if err != nil {
		t.Fatal(err)
	}
	checkMetadata(t, c, fromTemplate, got[fromTemplate.UID], "resourceclaimtemplates/gpu/gpu", "gpu-1", "gpu-2")
	checkMetadata(t, c, standalone, got[standalone.UID], "resourceclaims/standalone/gpu", "gpu-0")
	waitStatus(t, ctx, c, standalone, "gpu-0")

	// Unprepare removes the claim's metadata (the library does), and nothing else.
	if err := k.unprepare(ctx, standalone); err != nil {
		t.Fatal(err)
	}
	if left := metadataFiles(t, c, standalone); len(left) > 0 {
		t.Errorf("after unprepare, metadata of %s left: %v", standalone.Name, left)
	}
	if left := metadataFiles(t, c, fromTemplate); len(left) != 2 {
		t.Errorf("metadata of %s: %v, want its file and CDI spec", fromTemplate.Name, left)
	}

	// A crash, then the claim is deleted, and files of a claim nobody knows are lying around:
	// the next start removes all of them.
	if _, err := k.prepare(ctx, standalone); err != nil {
		t.Fatal(err)
	}
	p.kill()
	if err := c.claims.ResourceClaims(namespace).Delete(ctx, standalone.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ghostDir := filepath.Join(c.dataDir(), "dra-device-metadata", "other-ns_ghost", "gpu")
	ghostSpec := filepath.Join(c.cdiRoot, driverName+"_metadata_00000000-0000-4000-8000-00000000dead_gpu.json")
	otherDriver := filepath.Join(c.cdiRoot, "nic.example.com_metadata_00000000-0000-4000-8000-00000000dead_gpu.json")
	for _, f := range []string{filepath.Join(ghostDir, "metadata.json"), ghostSpec, otherDriver} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p = c.startPlugin(t, "")
	p.register(ctx, false)
	if left := metadataFiles(t, c, standalone); len(left) > 0 {
		t.Errorf("metadata of the deleted claim left after restart: %v", left)
	}
	for _, f := range []string{filepath.Dir(ghostDir), ghostSpec} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("stale %s left after restart: %v", f, err)
		}
	}
	if _, err := os.Stat(otherDriver); err != nil {
		t.Errorf("another driver's metadata spec was removed: %v", err)
	}
	if left := metadataFiles(t, c, fromTemplate); len(left) != 2 {
		t.Errorf("metadata of the still prepared %s: %v, want its file and CDI spec", fromTemplate.Name, left)
	}
	logs, _ := os.ReadFile(p.log)
	if !strings.Contains(string(logs), "Removed device metadata of claims that are no longer prepared") {
		t.Errorf("removal not logged:\n%s", tail(string(logs), 30))
	}
}

// waitStatus waits for the claim's status.devices to name exactly devices, each with the data of
// the device the node publishes.
func waitStatus(t *testing.T, ctx context.Context, c *cluster, claim *resourceapi.ResourceClaim, devices ...string) {
	t.Helper()
	var last []resourceapi.AllocatedDeviceStatus
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := c.claims.ResourceClaims(namespace).Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = got.Status.Devices
		return len(last) == len(devices), nil
	})
	if err != nil {
		t.Fatalf("claim %s: status.devices %+v, want %v: %v", claim.Name, last, devices, err)
	}
	for i, d := range last {
		var data map[string]resourceapi.DeviceAttribute
		if d.Data == nil || json.Unmarshal(d.Data.Raw, &data) != nil {
			t.Fatalf("claim %s device %s: data %v", claim.Name, d.Device, d.Data)
		}
		index := int64(deviceIndex(t, d.Device))
		if d.Driver != driverName || d.Pool != c.node || d.Device != devices[i] ||
			*data["uuid"].StringValue != simulated.DeviceUUID(c.node, int(index)) || *data["index"].IntValue != index ||
			*data["model"].StringValue != "LATEST-GPU-MODEL" || *data["driverVersion"].VersionValue != "1.0.0" {
			t.Errorf("claim %s: status.devices[%d] = %s/%s/%s %s", claim.Name, i, d.Driver, d.Pool, d.Device, d.Data.Raw)
		}
	}
}

func deviceIndex(t *testing.T, device string) int {
	t.Helper()
	var i int
	if _, err := fmt.Sscanf(device, "gpu-%d", &i); err != nil {
		t.Fatalf("device %q: %v", device, err)
	}
	return i
}

// checkMetadata checks what the container of a prepared claim gets: one metadata CDI ID on the
// request's first device, a CDI spec mounting the file at the path a reader looks for, and the
// file listing the devices with the attributes they publish.
func checkMetadata(t *testing.T, c *cluster, claim *resourceapi.ResourceClaim, got prepared, containerDir string, devices ...string) {
	t.Helper()
	wantID := driverName + "/metadata=" + string(claim.UID) + "_gpu"
	var ids []string
	for _, dev := range got {
		ids = append(ids, dev[1:]...)
	}
	if !reflect.DeepEqual(ids, []string{wantID}) {
		t.Errorf("claim %s: metadata CDI IDs %v, want one %s", claim.Name, ids, wantID)
	}
	spec, err := cdiapi.ReadSpec(filepath.Join(c.cdiRoot, driverName+"_metadata_"+string(claim.UID)+"_gpu.json"), 0)
	if err != nil {
		t.Fatalf("claim %s: metadata CDI spec: %v", claim.Name, err)
	}
	d := spec.GetDevice(string(claim.UID) + "_gpu")
	if d == nil || len(d.ContainerEdits.Mounts) != 1 {
		t.Fatalf("claim %s: metadata CDI spec %+v", claim.Name, spec.Spec)
	}
	mount := d.ContainerEdits.Mounts[0]
	hostFile := filepath.Join(c.dataDir(), "dra-device-metadata", claim.Namespace+"_"+claim.Name, "gpu", "metadata.json")
	wantContainer := filepath.Join(metadata.ContainerDir, containerDir, driverName+"-metadata.json")
	if mount.HostPath != hostFile || mount.ContainerPath != wantContainer {
		t.Errorf("claim %s: mount %s -> %s, want %s -> %s", claim.Name, mount.HostPath, mount.ContainerPath, hostFile, wantContainer)
	}
	f, err := os.Open(hostFile)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	// Newest version first, then v1alpha1 for readers built against 1.36.
	var versions []string
	dec := json.NewDecoder(f)
	for dec.More() {
		var doc struct {
			APIVersion string `json:"apiVersion"`
		}
		if err := dec.Decode(&doc); err != nil {
			t.Fatal(err)
		}
		versions = append(versions, doc.APIVersion)
	}
	if want := []string{"metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"}; !reflect.DeepEqual(versions, want) {
		t.Errorf("claim %s: metadata file holds %v, want %v", claim.Name, versions, want)
	}
	if _, err := f.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	var dm metadata.DeviceMetadata
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(f), &dm); err != nil {
		t.Fatalf("claim %s: the library's reader: %v", claim.Name, err)
	}
	if dm.UID != claim.UID || len(dm.Requests) != 1 || dm.Requests[0].Name != "gpu" || len(dm.Requests[0].Devices) != len(devices) {
		t.Fatalf("claim %s: metadata %+v", claim.Name, dm)
	}
	for _, dev := range dm.Requests[0].Devices {
		i := int64(deviceIndex(t, dev.Name))
		a := dev.Attributes
		if dev.Driver != driverName || dev.Pool != c.node || *a["uuid"].StringValue != simulated.DeviceUUID(c.node, int(i)) ||
			*a["index"].IntValue != i || *a["model"].StringValue != "LATEST-GPU-MODEL" || *a["driverVersion"].VersionValue != "1.0.0" {
			t.Errorf("claim %s: metadata device %+v", claim.Name, dev)
		}
	}
}

// metadataFiles lists the claim's metadata directory and CDI spec, where they exist.
func metadataFiles(t *testing.T, c *cluster, claim *resourceapi.ResourceClaim) []string {
	t.Helper()
	var out []string
	for _, f := range []string{
		filepath.Join(c.dataDir(), "dra-device-metadata", claim.Namespace+"_"+claim.Name),
		filepath.Join(c.cdiRoot, driverName+"_metadata_"+string(claim.UID)+"_gpu.json"),
	} {
		if _, err := os.Stat(f); err == nil {
			out = append(out, f)
		}
	}
	return out
}
