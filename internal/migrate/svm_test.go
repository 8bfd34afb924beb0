package migrate_test

import (
	"maps"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpu-dra/gpu-dra/internal/migrate"
)

func migratedResource(t *testing.T, svm *unstructured.Unstructured) map[string]any {
	t.Helper()
	r, _, err := unstructured.NestedMap(svm.Object, "spec", "resource")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestStorageVersionMigration: where the API is served and the migrator answers, one migration
// per resource does the work and no object is touched; the spec names the resource as each API
// version wants it.
func TestStorageVersionMigration(t *testing.T) {
	for _, version := range []string{"v1", "v1beta1", "v1alpha1"} {
		t.Run(version, func(t *testing.T) {
			s := newFakeServer(object("deviceclasses", "", "stale-gpu"))
			svm := &migrations{condition: "Succeeded", polls: 2}
			svm.install(s.fake)
			results, err := run(t, s, version)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range byResource(t, results) {
				if r.Method != migrate.StorageVersionMigration || !strings.HasPrefix(r.Migration, "kubectl-dra-"+r.Resource+"-") || r.Note != "" {
					t.Errorf("%+v, want the work done by a StorageVersionMigration of its own", r)
				}
			}
			if len(s.updates) != 0 {
				t.Errorf("updates %v, want none", s.updates)
			}
			if len(svm.created) != 4 {
				t.Fatalf("%d migrations created, want one per resource", len(svm.created))
			}
			for _, c := range svm.created {
				if got := c.GetAPIVersion(); got != "storagemigration.k8s.io/"+version {
					t.Errorf("migration created as %s, want storagemigration.k8s.io/%s", got, version)
				}
				resource := strings.TrimSuffix(strings.TrimPrefix(c.GetGenerateName(), "kubectl-dra-"), "-")
				want := map[string]any{"group": "resource.k8s.io", "resource": resource}
				if version == "v1alpha1" {
					want["version"] = "v1"
				}
				if got := migratedResource(t, c); !maps.Equal(got, want) {
					t.Errorf("spec.resource %v, want %v", got, want)
				}
			}
		})
	}
}

// TestStorageVersionMigrationFailed: a migration that fails leaves the resource to a rewrite and
// says why; the next resource still gets a migration.
func TestStorageVersionMigrationFailed(t *testing.T) {
	s := newFakeServer(object("deviceclasses", "", "stale-gpu"))
	svm := &migrations{condition: "Failed"}
	svm.install(s.fake)
	results, err := run(t, s, "v1")
	if err != nil {
		t.Fatal(err)
	}
	got := byResource(t, results)
	if r := got["deviceclasses"]; r.Method != migrate.Rewrite || r.Rewritten != 1 || !strings.Contains(r.Note, "migrator says Failed") {
		t.Errorf("deviceclasses: %+v, want a rewrite noting the migration's failure", r)
	}
	if len(svm.created) != 4 || len(svm.deleted) != 0 {
		t.Errorf("%d migrations created, %d deleted; want one per resource, none deleted", len(svm.created), len(svm.deleted))
	}
}

// TestNoMigratorController: migrations that get no condition within the start timeout are
// deleted and their resources rewritten; the resources wait for a controller all at once.
func TestNoMigratorController(t *testing.T) {
	s := newFakeServer(object("deviceclasses", "", "stale-gpu"), object("resourceslices", "", "stale-node-a"))
	svm := &migrations{}
	svm.install(s.fake)
	start := time.Now()
	results, err := run(t, s, "v1", migrate.WithStartTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %s: the 4 resources waited for a controller one after the other, not at once", d)
	}
	for _, r := range byResource(t, results) {
		if r.Method != migrate.Rewrite || !strings.Contains(r.Note, "no migrator controller took it up within 1s") {
			t.Errorf("%+v, want a rewrite noting that no controller runs", r)
		}
	}
	if len(svm.created) != 4 || len(svm.deleted) != 4 {
		t.Errorf("migrations created %d, deleted %v; want the 4 no controller took up deleted", len(svm.created), svm.deleted)
	}
	if s.updates["stale-gpu"] != 1 || s.updates["stale-node-a"] != 1 {
		t.Errorf("updates %v, want each object rewritten", s.updates)
	}
}

func TestMethodChoice(t *testing.T) {
	t.Run("rewrite creates no migration", func(t *testing.T) {
		s := newFakeServer(object("deviceclasses", "", "stale-gpu"))
		svm := &migrations{condition: "Succeeded"}
		svm.install(s.fake)
		if _, err := run(t, s, "v1", migrate.WithMethod(migrate.Rewrite)); err != nil {
			t.Fatal(err)
		}
		if len(svm.created) != 0 || s.updates["stale-gpu"] != 1 {
			t.Errorf("%d migrations, updates %v; want only the rewrite", len(svm.created), s.updates)
		}
	})
	t.Run("storageversionmigration where the API is not served", func(t *testing.T) {
		_, err := run(t, newFakeServer(), "", migrate.WithMethod(migrate.StorageVersionMigration))
		if err == nil || !strings.Contains(err.Error(), "storagemigration.k8s.io") || !strings.Contains(err.Error(), "rewrite") {
			t.Errorf("error %v, want one naming the API and the rewrite method", err)
		}
	})
	t.Run("storageversionmigration without a controller", func(t *testing.T) {
		s := newFakeServer(object("deviceclasses", "", "stale-gpu"))
		(&migrations{}).install(s.fake)
		_, err := run(t, s, "v1", migrate.WithMethod(migrate.StorageVersionMigration))
		if err == nil || !strings.Contains(err.Error(), "deviceclasses") || !strings.Contains(err.Error(), "no migrator controller") {
			t.Errorf("error %v, want deviceclasses' migration that no controller took up", err)
		}
		if len(s.updates) != 0 {
			t.Errorf("updates %v, want none", s.updates)
		}
	})
}

func TestNewRefusesBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  migrate.Option
		want string
	}{
		{"unknown method", migrate.WithMethod("copy"), `method "copy"`},
		{"too many workers", migrate.WithConcurrency(migrate.MaxConcurrency + 1), "concurrency 17"},
		{"no workers", migrate.WithConcurrency(0), "concurrency 0"},
		{"empty pages", migrate.WithPageSize(0), "page size 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := migrate.New(nil, nil, tc.opt); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v, want an error saying %s", err, tc.want)
			}
		})
	}
}
