package migrate_test

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/gpu-dra/gpu-dra/internal/migrate"
	"github.com/gpu-dra/gpu-dra/internal/rewriterecord"
)

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// recorded reads the record of rewrites from the fake server; nil when there is none.
func recorded(t *testing.T, s *fakeServer) map[string]rewriterecord.Entry {
	t.Helper()
	u, err := s.fake.Resource(configMaps).Namespace(rewriterecord.Namespace).Get(context.Background(), rewriterecord.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cm); err != nil {
		t.Fatal(err)
	}
	entries, err := rewriterecord.Decode(&cm)
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

// TestRewriteIsRecorded: the resources whose every object was rewritten, found current or gone
// are recorded for preflight with the version they were written in and the API server's version;
// a resource with a refused object is not; a second run adds to the record; a dry run records
// nothing.
func TestRewriteIsRecorded(t *testing.T) {
	s := newFakeServer(
		object("deviceclasses", "", "stale-gpu"),
		object("resourceclaims", "other", "stale-invalid"),
		object("resourceslices", "", "stale-node-a"),
	)
	s.refused["stale-invalid"] = true
	if _, err := run(t, s, "", migrate.WithDryRun(true)); err != nil {
		t.Fatal(err)
	}
	if got := recorded(t, s); got != nil {
		t.Fatalf("a dry run recorded %v", got)
	}
	if _, err := run(t, s, ""); err != nil {
		t.Fatal(err)
	}
	got := recorded(t, s)
	var names []string
	for res, e := range got {
		names = append(names, res)
		if e.Version != "v1" || e.Server == "" || e.Completed.IsZero() {
			t.Errorf("%s: %+v, want version v1, the server's version and a time", res, e)
		}
	}
	slices.Sort(names)
	if want := []string{"deviceclasses", "resourceclaimtemplates", "resourceslices"}; !slices.Equal(names, want) {
		t.Errorf("recorded %v, want %v (not resourceclaims, one of which was refused)", names, want)
	}
	if got["deviceclasses"].Objects != 1 {
		t.Errorf("deviceclasses: %d objects recorded, want 1", got["deviceclasses"].Objects)
	}

	delete(s.refused, "stale-invalid")
	if _, err := run(t, s, ""); err != nil {
		t.Fatal(err)
	}
	if got := recorded(t, s); len(got) != 4 {
		t.Errorf("after a complete run the record has %d resources, want 4: %v", len(got), got)
	}
}
