package upgradecheck

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// Release is a Kubernetes minor release, e.g. 1.38.
type Release struct {
	Major, Minor int
}

// ParseRelease reads "1.38", "v1.38" or "1.38.2" (the patch is ignored).
func ParseRelease(s string) (Release, error) {
	parts := strings.Split(strings.TrimPrefix(strings.TrimSpace(s), "v"), ".")
	if len(parts) < 2 || len(parts) > 3 {
		return Release{}, fmt.Errorf("%q is not a Kubernetes release: write it as 1.38", s)
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil || major < 1 || minor < 0 {
		return Release{}, fmt.Errorf("%q is not a Kubernetes release: write it as 1.38", s)
	}
	return Release{Major: major, Minor: minor}, nil
}

func (r Release) String() string { return fmt.Sprintf("%d.%d", r.Major, r.Minor) }

// Before reports whether r is older than o.
func (r Release) Before(o Release) bool {
	return r.Major < o.Major || (r.Major == o.Major && r.Minor < o.Minor)
}

// Next is the release after r.
func (r Release) Next() Release { return Release{Major: r.Major, Minor: r.Minor + 1} }

// Lifecycle is when a resource.k8s.io version is deprecated and when the API server stops
// serving it; both nil for a version with no end (GA).
type Lifecycle struct {
	Version    string
	Deprecated *Release
	Removed    *Release
}

// RemovedBy reports whether target no longer serves the version.
func (l Lifecycle) RemovedBy(target Release) bool {
	return l.Removed != nil && !target.Before(*l.Removed)
}

// DeprecatedBy reports whether target warns about the version.
func (l Lifecycle) DeprecatedBy(target Release) bool {
	return l.Deprecated != nil && !target.Before(*l.Deprecated)
}

// lifecycled is what prerelease-lifecycle-gen adds to the beta API types from their
// "+k8s:prerelease-lifecycle-gen:deprecated/removed" tags (or introduced+3 and +6 without them),
// and what the API server itself uses to stop serving a version.
type lifecycled interface {
	APILifecycleDeprecated() (major, minor int)
	APILifecycleRemoved() (major, minor int)
}

// lifecycles are the Known versions' lifecycles, newest version first, read from the types of the
// k8s.io/api release this binary is built with.
var lifecycles = func() []Lifecycle {
	var out []Lifecycle
	for _, add := range []func(*runtime.Scheme) error{resourceapi.AddToScheme, resourcev1beta2.AddToScheme, resourcev1beta1.AddToScheme} {
		s := runtime.NewScheme()
		if err := add(s); err != nil {
			panic(err) // a scheme registration error is a build defect
		}
		for gv := range resourceGroupVersions(s) {
			out = append(out, lifecycleOf(s, gv))
		}
	}
	slices.SortFunc(out, func(a, b Lifecycle) int {
		return slices.Index(resourceversion.Known, a.Version) - slices.Index(resourceversion.Known, b.Version)
	})
	return out
}()

func resourceGroupVersions(s *runtime.Scheme) map[schema.GroupVersion]bool {
	out := map[schema.GroupVersion]bool{}
	for _, gv := range s.PrioritizedVersionsAllGroups() {
		if gv.Group == resourceversion.Group {
			out[gv] = true
		}
	}
	return out
}

// lifecycleOf is the earliest deprecation and removal among the kinds this project uses: a
// version is as good as gone once one of them is.
func lifecycleOf(s *runtime.Scheme, gv schema.GroupVersion) Lifecycle {
	l := Lifecycle{Version: gv.Version}
	for _, kind := range []string{resourceversion.KindClaim, resourceversion.KindTemplate, resourceversion.KindDeviceClass, resourceversion.KindResourceSlice} {
		obj, err := s.New(gv.WithKind(kind))
		if err != nil {
			continue
		}
		lc, ok := obj.(lifecycled)
		if !ok {
			continue
		}
		dep, rem := release(lc.APILifecycleDeprecated()), release(lc.APILifecycleRemoved())
		if l.Deprecated == nil || dep.Before(*l.Deprecated) {
			l.Deprecated = &dep
		}
		if l.Removed == nil || rem.Before(*l.Removed) {
			l.Removed = &rem
		}
	}
	return l
}

func release(major, minor int) Release { return Release{Major: major, Minor: minor} }

// Lifecycles returns the lifecycle of every Known version, newest version first.
func Lifecycles() []Lifecycle { return slices.Clone(lifecycles) }

// LifecycleOf returns the lifecycle of one Known version; ok is false for others.
func LifecycleOf(version string) (Lifecycle, bool) {
	for _, l := range lifecycles {
		if l.Version == version {
			return l, true
		}
	}
	return Lifecycle{}, false
}

// Kept lists the Known versions target still serves (some only when enabled), newest first.
func Kept(target Release) []string {
	var out []string
	for _, l := range lifecycles {
		if !l.RemovedBy(target) {
			out = append(out, l.Version)
		}
	}
	return out
}

// FirstRemoval is the earliest release that stops serving one of the Known versions: the
// default target when there is no cluster to count from.
func FirstRemoval() Release {
	var first *Release
	for _, l := range lifecycles {
		if l.Removed != nil && (first == nil || l.Removed.Before(*first)) {
			first = l.Removed
		}
	}
	if first == nil {
		return Release{Major: 1, Minor: 38}
	}
	return *first
}
