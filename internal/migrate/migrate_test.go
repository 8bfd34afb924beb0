package migrate_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpu-dra/gpu-dra/internal/migrate"
)

func run(t *testing.T, s *fakeServer, svmVersion string, opts ...migrate.Option) ([]migrate.Result, error) {
	t.Helper()
	opts = append([]migrate.Option{migrate.WithPollInterval(time.Millisecond), migrate.WithStartTimeout(50 * time.Millisecond)}, opts...)
	m, err := migrate.New(s.client, fakeDiscovery(svmVersion), opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	return m.Run(ctx)
}

func byResource(t *testing.T, results []migrate.Result) map[string]migrate.Result {
	t.Helper()
	m := map[string]migrate.Result{}
	for _, r := range results {
		m[r.Resource] = r
	}
	names := make([]string, 0, len(results))
	for _, r := range results {
		names = append(names, r.Resource)
	}
	if want := []string{"deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"}; !slices.Equal(names, want) {
		t.Errorf("resources migrated: %v, want %v (updatable, without subresources, in name order)", names, want)
	}
	return m
}

// TestRewrite: every object is updated once as read; those stored anew count as rewritten, the
// others as unchanged; conflicts are retried after reading the object again; an object deleted
// meanwhile is gone, one the API server refuses fails with its name and the reason.
func TestRewrite(t *testing.T) {
	s := newFakeServer(
		object("deviceclasses", "", "stale-gpu"),
		object("deviceclasses", "", "current-gpu"),
		object("resourceclaims", "jobs", "stale-busy"),
		object("resourceclaims", "jobs", "stale-deleted"),
		object("resourceclaims", "other", "stale-invalid"),
		object("resourceslices", "", "stale-node-a"),
	)
	s.conflicts["stale-busy"] = 2
	s.gone["stale-deleted"] = true
	s.refused["stale-invalid"] = true
	results, err := run(t, s, "")
	if err != nil {
		t.Fatal(err)
	}
	got := byResource(t, results)
	want := map[string]migrate.Result{
		"deviceclasses":          {Objects: 2, Rewritten: 1, Unchanged: 1},
		"resourceclaims":         {Objects: 3, Rewritten: 1, Gone: 1, Failed: 1},
		"resourceclaimtemplates": {},
		"resourceslices":         {Objects: 1, Rewritten: 1},
	}
	for resource, w := range want {
		r := got[resource]
		if r.Method != migrate.Rewrite || r.Version != "v1" {
			t.Errorf("%s: method %s version %s, want a rewrite in v1", resource, r.Method, r.Version)
		}
		if r.Objects != w.Objects || r.Rewritten != w.Rewritten || r.Unchanged != w.Unchanged || r.Gone != w.Gone || r.Failed != w.Failed {
			t.Errorf("%s: %+v, want counts %+v", resource, r, w)
		}
	}
	if errs := got["resourceclaims"].Errors; len(errs) != 1 || !strings.Contains(errs[0], "other/stale-invalid") || !strings.Contains(errs[0], "no longer valid") {
		t.Errorf("resourceclaims errors: %q, want other/stale-invalid's refusal", errs)
	}
	if s.updates["stale-busy"] != 3 || s.gets["stale-busy"] != 2 {
		t.Errorf("stale-busy: %d updates and %d reads, want 3 updates, each conflict followed by a read", s.updates["stale-busy"], s.gets["stale-busy"])
	}
	if s.updates["stale-invalid"] != 1 || s.updates["current-gpu"] != 1 {
		t.Errorf("updates %v: want one of each object that does not conflict", s.updates)
	}
}

// TestRewriteGivesUpOnEndlessConflicts: the retries of a conflicted object are bounded.
func TestRewriteGivesUpOnEndlessConflicts(t *testing.T) {
	s := newFakeServer(object("resourceslices", "", "stale-contended"))
	s.conflicts["stale-contended"] = 1000
	results, err := run(t, s, "")
	if err != nil {
		t.Fatal(err)
	}
	r := byResource(t, results)["resourceslices"]
	if r.Failed != 1 || len(r.Errors) != 1 || !strings.Contains(r.Errors[0], "modified") {
		t.Errorf("%+v, want the contended slice failed with the conflict", r)
	}
	if n := s.updates["stale-contended"]; n < 2 || n > 10 {
		t.Errorf("%d updates of the contended slice, want a few retries", n)
	}
}

// TestRewriteConcurrencyIsBounded: no more updates are in flight than allowed, and as many as
// allowed are.
func TestRewriteConcurrencyIsBounded(t *testing.T) {
	var objects []runtime.Object
	for i := range 24 {
		objects = append(objects, object("resourceclaims", "jobs", "stale-"+strings.Repeat("x", i+1)))
	}
	s := newFakeServer(objects...)
	s.delay = 20 * time.Millisecond
	results, err := run(t, s, "", migrate.WithConcurrency(3))
	if err != nil {
		t.Fatal(err)
	}
	if r := byResource(t, results)["resourceclaims"]; r.Rewritten != 24 {
		t.Errorf("%+v, want 24 rewritten", r)
	}
	if got := s.maxInFlight.Load(); got != 3 {
		t.Errorf("at most %d updates in flight, want 3", got)
	}
}

// TestDryRun: every update is a server-side dry run, and no StorageVersionMigration is created.
func TestDryRun(t *testing.T) {
	s := newFakeServer(object("deviceclasses", "", "current-gpu"), object("resourceclaims", "jobs", "stale-invalid"))
	s.refused["stale-invalid"] = true
	var dryRuns []bool
	s.fake.PrependReactor("update", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		dryRuns = append(dryRuns, isDryRun(a))
		return false, nil, nil
	})
	svm := &migrations{condition: "Succeeded"}
	svm.install(s.fake)
	results, err := run(t, s, "v1", migrate.WithDryRun(true))
	if err != nil {
		t.Fatal(err)
	}
	got := byResource(t, results)
	if r := got["deviceclasses"]; !r.DryRun || r.Method != migrate.Rewrite || r.Rewritten != 1 || !strings.Contains(r.Note, "StorageVersionMigration") {
		t.Errorf("deviceclasses: %+v, want a dry-run rewrite accepted, noting the StorageVersionMigration a real run tries", r)
	}
	if r := got["resourceclaims"]; r.Failed != 1 {
		t.Errorf("resourceclaims: %+v, want the refused claim failed", r)
	}
	if len(svm.created) != 0 {
		t.Errorf("%d StorageVersionMigrations created in a dry run", len(svm.created))
	}
	if len(dryRuns) != 2 || slices.Contains(dryRuns, false) {
		t.Errorf("updates' dry run: %v, want every update a dry run", dryRuns)
	}
}

func isDryRun(a clienttesting.Action) bool {
	u, ok := a.(interface{ GetUpdateOptions() metav1.UpdateOptions })
	return ok && slices.Equal(u.GetUpdateOptions().DryRun, []string{metav1.DryRunAll})
}
