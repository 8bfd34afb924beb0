package releases

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/version"
)

// TestReleases: each release is a full version, and they come in order.
func TestReleases(t *testing.T) {
	var prev *version.Version
	for _, r := range []string{Oldest, UpgradeVia, Seed, Newest} {
		v, err := version.ParseSemantic(r)
		if err != nil {
			t.Fatalf("releases.env: %q: %v", r, err)
		}
		if prev != nil && !prev.LessThan(v) {
			t.Errorf("releases.env: %s does not come after %s", v, prev)
		}
		prev = v
	}
}
