package migrate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
)

const storageMigrationGroup = "storagemigration.k8s.io"

// storageMigrationVersions are the versions of the API this package writes, newest first: v1
// (1.37), v1beta1 (1.35, off unless enabled) and v1alpha1 (1.30-1.34, off unless enabled), whose
// spec names the resource's version too.
var storageMigrationVersions = []string{"v1", "v1beta1", "v1alpha1"}

// errNoController: the migration got no condition in time, so no migrator controller runs
// (kube-controller-manager without StorageVersionMigrator, or no controller manager at all).
var errNoController = errors.New("no migrator controller took it up")

// storageMigrationVersion returns the newest storagemigration.k8s.io version the cluster serves,
// or "".
func (m *Migrator) storageMigrationVersion() (string, error) {
	groups, err := m.discovery.ServerGroups()
	if err != nil {
		return "", fmt.Errorf("discover API groups: %w", err)
	}
	for _, g := range groups.Groups {
		if g.Name != storageMigrationGroup {
			continue
		}
		best := ""
		for _, v := range g.Versions {
			i := slices.Index(storageMigrationVersions, v.Version)
			if i >= 0 && (best == "" || i < slices.Index(storageMigrationVersions, best)) {
				best = v.Version
			}
		}
		return best, nil
	}
	return "", nil
}

// migrationStatus is what is read of a StorageVersionMigration's status in every version.
type migrationStatus struct {
	Status struct {
		Conditions []metav1.Condition `json:"conditions"`
	} `json:"status"`
}

// viaStorageVersionMigration creates a StorageVersionMigration for gvr and waits for it to
// succeed; it returns the migration's name, or why it did not succeed. A migration no controller
// takes up is deleted again.
func (m *Migrator) viaStorageVersionMigration(ctx context.Context, svmVersion string, gvr schema.GroupVersionResource) (string, error) {
	logger := klog.FromContext(ctx)
	client := m.client.Resource(schema.GroupVersionResource{Group: storageMigrationGroup, Version: svmVersion, Resource: "storageversionmigrations"})
	resource := map[string]any{"group": gvr.Group, "resource": gvr.Resource}
	if svmVersion == "v1alpha1" {
		resource["version"] = gvr.Version
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": storageMigrationGroup + "/" + svmVersion,
		"kind":       "StorageVersionMigration",
		"metadata":   map[string]any{"generateName": "kubectl-dra-" + gvr.Resource + "-"},
		"spec":       map[string]any{"resource": resource},
	}}
	rctx, cancel := context.WithTimeout(ctx, m.o.requestTimeout)
	created, err := client.Create(rctx, obj, metav1.CreateOptions{})
	cancel()
	if err != nil {
		return "", fmt.Errorf("create a StorageVersionMigration: %w", err)
	}
	name := created.GetName()
	logger.V(2).Info("Created StorageVersionMigration", "name", name, "resource", gvr.Resource)
	m.o.progress(gvr.Resource, "StorageVersionMigration "+name+" created")
	err = m.waitForMigration(ctx, client, name, gvr.Resource)
	if errors.Is(err, errNoController) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.o.requestTimeout)
		if derr := client.Delete(dctx, name, metav1.DeleteOptions{}); derr != nil {
			logger.Info("Could not delete the StorageVersionMigration no controller took up", "name", name, "err", derr)
		}
		cancel()
	}
	switch {
	case errors.Is(err, errNoController):
		// Deleted: its name would tell the user nothing, and the note reads the same for every
		// resource.
		return "", fmt.Errorf("StorageVersionMigration: %w", err)
	case err != nil:
		return "", fmt.Errorf("StorageVersionMigration %s: %w", name, err)
	}
	return name, nil
}

// waitForMigration polls the migration until it succeeds, fails, gets no condition within the
// start timeout, or runs out of the migration timeout.
func (m *Migrator) waitForMigration(ctx context.Context, client interface {
	Get(context.Context, string, metav1.GetOptions, ...string) (*unstructured.Unstructured, error)
}, name, resource string) error {
	start := time.Now()
	lastShown, lastState := start, ""
	ticker := time.NewTicker(m.o.pollInterval)
	defer ticker.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, m.o.requestTimeout)
		obj, err := client.Get(rctx, name, metav1.GetOptions{})
		cancel()
		if err != nil {
			return fmt.Errorf("read its status: %w", err)
		}
		var st migrationStatus
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &st); err != nil {
			return fmt.Errorf("read its status: %w", err)
		}
		conds := st.Status.Conditions
		elapsed := time.Since(start)
		switch {
		case apimeta.IsStatusConditionTrue(conds, "Succeeded"):
			m.o.progress(resource, fmt.Sprintf("StorageVersionMigration %s succeeded (%s)", name, round(elapsed)))
			return nil
		case apimeta.IsStatusConditionTrue(conds, "Failed"):
			return fmt.Errorf("failed: %s", apimeta.FindStatusCondition(conds, "Failed").Message)
		case len(conds) == 0 && elapsed >= m.o.startTimeout:
			return fmt.Errorf("%w within %s (is kube-controller-manager running, with the StorageVersionMigrator feature?)", errNoController, m.o.startTimeout)
		case elapsed >= m.o.migrationTimeout:
			return fmt.Errorf("not done within %s", m.o.migrationTimeout)
		}
		state := "waiting for the migrator controller"
		if len(conds) > 0 {
			state = "running"
		}
		// One line per change, and one every 10s while nothing changes.
		if state != lastState || time.Since(lastShown) >= 10*time.Second {
			m.o.progress(resource, fmt.Sprintf("StorageVersionMigration %s %s (%s)", name, state, round(elapsed)))
			lastShown, lastState = time.Now(), state
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
		}
	}
}

func round(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }
