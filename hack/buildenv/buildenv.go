// Package buildenv gives Go tests what build.env (included by the Makefile, sourced by the shell
// scripts) says: the Kubernetes releases gpu-dra is tested on and the project image. Release
// versions have no "v".
package buildenv

import (
	_ "embed"
	"os"
	"strings"
)

//go:embed build.env
var env string

var (
	// Oldest is the oldest supported release: the seed's 1.32, DRA beta behind its feature gate.
	Oldest = value("K8S_RELEASE_OLDEST")
	// UpgradeVia is the release the in-place upgrade from Oldest to Seed passes through.
	UpgradeVia = value("K8S_RELEASE_UPGRADE_VIA")
	// Seed is the seed's release, the local cluster's default.
	Seed = value("K8S_RELEASE_SEED")
	// ToNewest are the releases an in-place upgrade from Seed to Newest passes through.
	ToNewest = strings.Split(value("K8S_RELEASES_TO_NEWEST"), ",")
	// Newest is the newest supported release.
	Newest = value("K8S_RELEASE_NEWEST")

	// ImageRepository and ImageTag are the project image as build.env names it.
	ImageRepository = value("PROJECT_IMAGE_REPOSITORY")
	ImageTag        = value("PROJECT_IMAGE_TAG")
)

// Image is the project image under test as repository and tag: $PROJECT_IMAGE when set (the
// Makefile sets it from VERSION), else ImageRepository and ImageTag.
func Image() (repository, tag string) {
	if image := os.Getenv("PROJECT_IMAGE"); image != "" {
		// The tag follows the last colon, unless that colon is a registry's port.
		if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
			return image[:i], image[i+1:]
		}
		return image, "latest"
	}
	return ImageRepository, ImageTag
}

// value is NAME's value in build.env; the file is part of this package, so a missing name is a bug
// in it, which the package's test finds.
func value(name string) string {
	for line := range strings.Lines(env) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+"="); ok {
			return v
		}
	}
	panic("build.env has no " + name)
}
