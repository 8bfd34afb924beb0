package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra/internal/migrate"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

const noController = "StorageVersionMigration: no migrator controller took it up within 30s " +
	"(is kube-controller-manager running, with the StorageVersionMigrator feature?)"

// migrationCases are the results a migration can give; their text is golden.
var migrationCases = []struct {
	name    string
	dryRun  bool
	results []migrate.Result
}{
	{name: "rewritten-no-controller", results: []migrate.Result{
		{Resource: "deviceclasses", Version: "v1", Method: migrate.Rewrite, Objects: 3, Rewritten: 2, Unchanged: 1,
			Note: noController},
		{Resource: "resourceclaims", Version: "v1", Method: migrate.Rewrite, Objects: 1200, Rewritten: 1100, Unchanged: 99, Gone: 1, Note: noController},
		{Resource: "resourceslices", Version: "v1", Method: migrate.Rewrite, Objects: 8, Rewritten: 8},
	}},
	{name: "storageversionmigration", results: []migrate.Result{
		{Resource: "deviceclasses", Version: "v1", Method: migrate.StorageVersionMigration, Migration: "kubectl-dra-deviceclasses-4nq8d"},
		{Resource: "resourceclaims", Version: "v1", Method: migrate.Rewrite, Objects: 2, Rewritten: 2,
			Note: "StorageVersionMigration kubectl-dra-resourceclaims-m2k9x: failed: the migrator could not list resourceclaims"},
	}},
	{name: "refused", results: []migrate.Result{
		{Resource: "resourceclaims", Version: "v1beta2", Method: migrate.Rewrite, Objects: 14, Rewritten: 1, Unchanged: 1, Failed: 12,
			Errors: []string{
				`jobs/a: ResourceClaim.resource.k8s.io "a" is invalid: spec: Invalid value: "x": no longer valid`,
				`jobs/b: admission webhook "claims.gpu.example.com" denied the request: selector names no attribute`,
			}},
	}},
	{name: "dry-run", dryRun: true, results: []migrate.Result{
		{Resource: "deviceclasses", Version: "v1", Method: migrate.Rewrite, Objects: 1, Rewritten: 1, DryRun: true,
			Note: "storagemigration.k8s.io/v1 is served: a StorageVersionMigration runs first"},
		{Resource: "devicetaintrules", Version: "v1", Method: migrate.Rewrite, DryRun: true,
			Note: "storagemigration.k8s.io/v1 is served: a StorageVersionMigration runs first"},
	}},
}

// TestMigrationText: the table, notes, refusals and verdict of each kind of result are golden;
// refusals make exit status 1.
func TestMigrationText(t *testing.T) {
	for _, tc := range migrationCases {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			printMigration(&out, tc.results)
			err := migrationVerdict(&out, tc.results, tc.dryRun, true)
			if err != nil {
				fmt.Fprintf(&out, "kubectl dra: %v\n", err)
			}
			golden(t, "testdata/migrate/golden/"+tc.name+".stdout", out.String())
			failed := 0
			for _, r := range tc.results {
				failed += r.Failed
			}
			if got, want := ExitCode(err), map[bool]int{true: ExitFailed, false: 0}[failed > 0]; got != want {
				t.Errorf("exit %d, want %d", got, want)
			}
		})
	}
}

func TestMigrateRefusesBadFlags(t *testing.T) {
	noCluster(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--method", "copy"}, `--method "copy"`},
		{[]string{"--concurrency", "0"}, "--concurrency 0"},
		{[]string{"--concurrency", "100"}, "--concurrency 100"},
		{[]string{"--timeout", "0s"}, "--timeout 0s"},
		{[]string{"-o", "yaml"}, `-o "yaml"`},
		{[]string{"extra"}, "unknown command"},
	} {
		r := run(t, "", append([]string{"migrate"}, tc.args...)...)
		if r.code != ExitFailed || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("migrate %v: exit %d, stderr %q; want exit %d and %q", tc.args, r.code, r.stderr, ExitFailed, tc.want)
		}
	}
}

// TestMigrateAgainstCluster runs the command through a kubeconfig on a real API server: objects
// the server stored in its storage version are listed and found unchanged; with -o json the same
// counts are machine-readable; a dry run stores nothing either. (The upgrade from objects stored
// as v1beta1 is internal/migrate's TestMigrateAfterUpgrade.)
func TestMigrateAgainstCluster(t *testing.T) {
	srv := testapiserver.Start(t)
	ctx := context.Background()
	for i := range 3 {
		if _, err := srv.Clientset.ResourceV1().DeviceClasses().Create(ctx, &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gpu-%d", i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := writeKubeconfig(t, srv.Config)
	t.Setenv("KUBECONFIG", "")
	text := run(t, "", "migrate", "--method", "rewrite", "--kubeconfig", kubeconfig)
	if text.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", text.code, text.stderr)
	}
	if row := regexp.MustCompile(`(?m)^deviceclasses +rewrite +3 +0 +3 +0 +0$`); !row.MatchString(text.stdout) {
		t.Errorf("want the 3 DeviceClasses listed and unchanged:\n%s", text.stdout)
	}

	out := run(t, "", "migrate", "--method", "rewrite", "-o", "json", "--kubeconfig", kubeconfig)
	var rep migrateReport
	if err := json.Unmarshal([]byte(out.stdout), &rep); err != nil || out.code != 0 {
		t.Fatalf("-o json: exit %d, %v:\n%s", out.code, err, out.stdout)
	}
	for _, r := range rep.Resources {
		if r.Resource == "deviceclasses" && (r.Objects != 3 || r.Unchanged != 3) {
			t.Errorf("-o json: %+v, want 3 deviceclasses unchanged", r)
		}
	}

	dry := run(t, "", "migrate", "--dry-run", "--kubeconfig", kubeconfig)
	if dry.code != 0 || !strings.Contains(dry.stdout, "nothing was stored") {
		t.Errorf("--dry-run: exit %d:\n%s\n%s", dry.code, dry.stdout, dry.stderr)
	}
	class, err := srv.Clientset.ResourceV1().DeviceClasses().Get(ctx, "gpu-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if class.Generation != 1 {
		t.Errorf("DeviceClass generation %d after migrations of a current object, want 1", class.Generation)
	}
}
