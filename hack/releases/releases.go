// Package releases gives Go tests the Kubernetes releases gpu-dra is tested on, as releases.env
// (sourced by the shell scripts, included by the Makefile) names them. Versions have no "v".
package releases

import (
	_ "embed"
	"strings"
)

//go:embed releases.env
var env string

var (
	// Oldest is the oldest supported release: the seed's 1.32, DRA beta behind its feature gate.
	Oldest = value("K8S_RELEASE_OLDEST")
	// UpgradeVia is the release the in-place upgrade from Oldest to Seed passes through.
	UpgradeVia = value("K8S_RELEASE_UPGRADE_VIA")
	// Seed is the seed's release, the local cluster's default.
	Seed = value("K8S_RELEASE_SEED")
	// Newest is the newest supported release.
	Newest = value("K8S_RELEASE_NEWEST")
)

// Tested are the releases the suites cover, oldest first.
func Tested() []string { return []string{Oldest, Seed, Newest} }

// value is NAME's value in releases.env; the file is part of this package, so a missing name is
// a bug in it, found by the package's test.
func value(name string) string {
	for line := range strings.Lines(env) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+"="); ok {
			return v
		}
	}
	panic("releases.env has no " + name)
}
