package buildenv

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/version"
)

// TestReleases: each release is a full version, and they come in order.
func TestReleases(t *testing.T) {
	var prev *version.Version
	releases := append(append([]string{Oldest, UpgradeVia, Seed}, ToNewest...), Newest)
	for _, r := range releases {
		v, err := version.ParseSemantic(r)
		if err != nil {
			t.Fatalf("build.env: %q: %v", r, err)
		}
		if prev != nil && !prev.LessThan(v) {
			t.Errorf("build.env: %s does not come after %s", v, prev)
		}
		prev = v
	}
}

func TestImage(t *testing.T) {
	for _, tc := range []struct{ env, repo, tag string }{
		{"", ImageRepository, ImageTag},
		{"ghcr.io/gpu-dra/gpu-dra:v0.2.0", "ghcr.io/gpu-dra/gpu-dra", "v0.2.0"},
		{"localhost:5000/gpu-dra:dev", "localhost:5000/gpu-dra", "dev"},
		{"localhost:5000/gpu-dra", "localhost:5000/gpu-dra", "latest"},
	} {
		t.Setenv("PROJECT_IMAGE", tc.env)
		if repo, tag := Image(); repo != tc.repo || tag != tc.tag {
			t.Errorf("PROJECT_IMAGE=%q: %s %s, want %s %s", tc.env, repo, tag, tc.repo, tc.tag)
		}
	}
}
