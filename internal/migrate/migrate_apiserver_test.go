package migrate_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/gpu-dra/gpu-dra/hack/buildenv"
	"github.com/gpu-dra/gpu-dra/internal/migrate"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
	"github.com/gpu-dra/gpu-dra/internal/testetcd"
)

// TestMigrateAfterUpgrade is a cluster's story in miniature: the oldest release (DRA beta) stores
// a DeviceClass, templates, claims (one allocated) and slices as v1beta1; the newest release's API
// server starts on the same etcd and still finds them encoded so; the migration leaves none of
// them in v1beta1, as etcd itself shows. The newest release serves storagemigration.k8s.io, but no
// controller manager runs here, so the migration falls back to rewriting each object.
func TestMigrateAfterUpgrade(t *testing.T) {
	ctx := t.Context()
	srv, created := upgradedServer(t)
	before := storedVersions(t, srv)

	results := runMigration(t, srv)
	rewritten := 0
	for _, r := range results {
		if r.Method != migrate.Rewrite || !strings.Contains(r.Note, "no migrator controller took it up") {
			t.Errorf("%s: method %s (%s), want a rewrite after no controller took up the StorageVersionMigration", r.Resource, r.Method, r.Note)
		}
		if r.Failed != 0 || r.Gone != 0 || r.Unchanged != 0 || r.Rewritten != r.Objects {
			t.Errorf("%s: %+v, want every object rewritten", r.Resource, r)
		}
		rewritten += r.Rewritten
	}
	if rewritten != created {
		t.Errorf("%d objects rewritten, want %d", rewritten, created)
	}

	after := storedVersions(t, srv)
	if got := countVersions(after); got["resource.k8s.io/v1"] != created || len(got) != 1 {
		t.Errorf("after the migration etcd holds %v, want all %d objects as resource.k8s.io/v1", got, created)
	}
	for i := range before {
		if i >= len(after) || after[i].Key != before[i].Key {
			t.Fatalf("etcd keys changed:\n before %v\n after %v", before, after)
		}
	}

	// The claim's allocation is status, which an update of the object keeps.
	claim, err := srv.Clientset.ResourceV1().ResourceClaims(namespace).Get(ctx, "allocated", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a := claim.Status.Allocation; a == nil || len(a.Devices.Results) != 1 || a.Devices.Results[0].Device != "gpu-0" {
		t.Errorf("allocated claim's status after the migration: %+v, want its allocation of gpu-0", claim.Status)
	}

	// Every object is current now: a second run stores nothing.
	for _, r := range runMigration(t, srv) {
		if r.Rewritten != 0 || r.Unchanged != r.Objects {
			t.Errorf("second run, %s: %+v, want every object unchanged", r.Resource, r)
		}
	}
	svms, err := dynamic.NewForConfigOrDie(srv.Config).Resource(svmGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(svms.Items) != 0 {
		t.Errorf("%d StorageVersionMigrations left behind, want none: those no controller took up are deleted", len(svms.Items))
	}
}

// TestMigrateThroughStorageVersionMigration: the same upgrade with kube-controller-manager's
// migrator running. The migrator takes every StorageVersionMigration up at once, but on an idle
// cluster some stay Running for minutes; those resources are rewritten after the (here short)
// migration timeout. At least one resource is the migrator's work, and etcd shows every object
// migrated either way.
func TestMigrateThroughStorageVersionMigration(t *testing.T) {
	kcm := testapiserver.ReleaseBinary(t, buildenv.Newest, "kube-controller-manager")
	srv, created := upgradedServer(t)
	// Only the controllers a StorageVersionMigration needs: the migrator and the garbage
	// collector, whose resource monitors it reads.
	srv.StartControllerManager(t, kcm, "migrat", "--controllers=garbage-collector-controller,storage-version-migrator-controller")
	migrated := 0
	for _, r := range runMigration(t, srv, migrate.WithStartTimeout(time.Minute), migrate.WithMigrationTimeout(15*time.Second)) {
		switch {
		case r.Method == migrate.StorageVersionMigration && r.Migration != "":
			migrated++
		case r.Method == migrate.Rewrite && strings.Contains(r.Note, "not done within 15s") && r.Failed == 0:
			t.Logf("%s: rewritten after the migrator's timeout", r.Resource)
		default:
			t.Errorf("%s: %+v, want it migrated by a StorageVersionMigration, or rewritten after one timed out", r.Resource, r)
		}
	}
	if migrated == 0 {
		t.Errorf("no resource migrated by a StorageVersionMigration")
	}
	if got := countVersions(storedVersions(t, srv)); got["resource.k8s.io/v1"] != created || len(got) != 1 {
		t.Errorf("after the migration etcd holds %v, want all %d objects as resource.k8s.io/v1", got, created)
	}
}

// upgradedServer stores objects through the oldest release's API server, then starts the newest
// on the same etcd, as a control-plane upgrade does, and checks that etcd still holds the objects
// as v1beta1. It returns the newest server and how many objects there are.
func upgradedServer(t *testing.T) (*testapiserver.Server, int) {
	t.Helper()
	oldDir := testapiserver.ReleaseAssetsDir(t, buildenv.Oldest)
	newDir := testapiserver.ReleaseAssetsDir(t, buildenv.Newest)
	dataDir := t.TempDir()
	old := testapiserver.Start(t, testapiserver.WithAssetsDir(oldDir), testapiserver.WithEtcdDataDir(dataDir),
		testapiserver.WithRuntimeConfig(testapiserver.Oldest), testapiserver.WithFeatureGates("DynamicResourceAllocation=true"))
	requireRelease(t, old, buildenv.Oldest)
	created := createV1beta1Objects(t, old)
	old.Stop(t)

	srv := testapiserver.Start(t, testapiserver.WithAssetsDir(newDir), testapiserver.WithEtcdDataDir(dataDir))
	requireRelease(t, srv, buildenv.Newest)
	if got := countVersions(storedVersions(t, srv)); got["resource.k8s.io/v1beta1"] != created {
		t.Fatalf("before the migration etcd holds %v, want all %d objects as resource.k8s.io/v1beta1", got, created)
	}
	return srv, created
}

const namespace = "gpu-jobs"

// requireRelease fails the test unless the running API server is of the release.
func requireRelease(t *testing.T, srv *testapiserver.Server, release string) {
	t.Helper()
	v, err := srv.Clientset.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != "v"+release {
		t.Fatalf("the API server runs %s, want v%s", v.GitVersion, release)
	}
}

// createV1beta1Objects stores, through the v1beta1 API, one object of each kind and a few more
// than a page of claims; it returns how many.
func createV1beta1Objects(t *testing.T, srv *testapiserver.Server) int {
	t.Helper()
	ctx := t.Context()
	cs := srv.Clientset
	rv := cs.ResourceV1beta1()
	n := 0
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("create %s: %v", what, err)
		}
		n++
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := rv.DeviceClasses().Create(ctx, &resourcev1beta1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu.example.com"},
		Spec: resourcev1beta1.DeviceClassSpec{Selectors: []resourcev1beta1.DeviceSelector{{
			CEL: &resourcev1beta1.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}}},
	}, metav1.CreateOptions{})
	must("DeviceClass", err)
	request := resourcev1beta1.DeviceRequest{Name: "gpu", DeviceClassName: "gpu.example.com", AllocationMode: resourcev1beta1.DeviceAllocationModeExactCount, Count: 1}
	spec := resourcev1beta1.ResourceClaimSpec{Devices: resourcev1beta1.DeviceClaim{Requests: []resourcev1beta1.DeviceRequest{request}}}
	for i := range 2 {
		_, err := rv.ResourceClaimTemplates(namespace).Create(ctx, &resourcev1beta1.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("one-gpu-%d", i)},
			Spec:       resourcev1beta1.ResourceClaimTemplateSpec{Spec: spec},
		}, metav1.CreateOptions{})
		must("ResourceClaimTemplate", err)
	}
	for i := range 5 {
		_, err := rv.ResourceClaims(namespace).Create(ctx, &resourcev1beta1.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", i)}, Spec: spec}, metav1.CreateOptions{})
		must("ResourceClaim", err)
	}
	claim, err := rv.ResourceClaims(namespace).Create(ctx, &resourcev1beta1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "allocated"}, Spec: spec}, metav1.CreateOptions{})
	must("ResourceClaim", err)
	claim.Status.Allocation = &resourcev1beta1.AllocationResult{Devices: resourcev1beta1.DeviceAllocationResult{
		Results: []resourcev1beta1.DeviceRequestAllocationResult{{Request: "gpu", Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-0"}}}}
	if _, err := rv.ResourceClaims(namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("allocate the claim: %v", err)
	}
	for _, node := range []string{"node-a", "node-b"} {
		_, err := rv.ResourceSlices().Create(ctx, &resourcev1beta1.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu.example.com"},
			Spec: resourcev1beta1.ResourceSliceSpec{Driver: "gpu.example.com", NodeName: node,
				Pool:    resourcev1beta1.ResourcePool{Name: node, ResourceSliceCount: 1},
				Devices: []resourcev1beta1.Device{{Name: "gpu-0", Basic: &resourcev1beta1.BasicDevice{}}}},
		}, metav1.CreateOptions{})
		must("ResourceSlice", err)
	}
	return n
}

// runMigration migrates with small pages, so that paging is exercised, and a short wait for a
// migrator controller, which does not run here.
func runMigration(t *testing.T, srv *testapiserver.Server, opts ...migrate.Option) []migrate.Result {
	t.Helper()
	opts = append([]migrate.Option{migrate.WithPageSize(2), migrate.WithStartTimeout(2 * time.Second), migrate.WithPollInterval(200 * time.Millisecond),
		migrate.WithProgress(func(resource, msg string) { t.Logf("%s: %s", resource, msg) })}, opts...)
	m, err := migrate.New(dynamic.NewForConfigOrDie(srv.Config), srv.Clientset.Discovery(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	results, err := m.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return results
}

// storedVersions reads the resource.k8s.io objects straight from the server's etcd.
func storedVersions(t *testing.T, srv *testapiserver.Server) []testetcd.Entry {
	t.Helper()
	entries, err := testetcd.Read(t.Context(), srv.EtcdEndpoint(), testetcd.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	in := testetcd.InGroup(entries, resourceversion.Group)
	for _, e := range in {
		t.Logf("etcd: %s %s", e.Key, e.APIVersion)
	}
	return in
}

func countVersions(entries []testetcd.Entry) map[string]int {
	n := map[string]int{}
	for _, e := range entries {
		n[e.APIVersion]++
	}
	return n
}
