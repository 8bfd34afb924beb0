package upgradecheck

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// MigrateCommand is the command that rewrites every resource.k8s.io object in the current
// storage version.
const MigrateCommand = "kubectl dra migrate"

// pageSize bounds every list: a cluster with many claims is read in pages, never in one answer.
const pageSize = 500

// defaultRequestTimeout bounds each request unless WithRequestTimeout says otherwise.
const defaultRequestTimeout = 10 * time.Second

// Conn is the connections the cluster checks read through.
type Conn struct {
	Kube kubernetes.Interface
	// Metadata counts objects without reading their bodies.
	Metadata metadata.Interface
	// Dynamic reads StorageVersionMigrations of whichever version is served.
	Dynamic dynamic.Interface
	// Metrics opens the API server's /metrics; nil when it cannot be asked.
	Metrics func(ctx context.Context) (io.ReadCloser, error)
}

type options struct {
	requestTimeout time.Duration
	maxMetrics     int64
}

// Option configures CheckCluster.
type Option func(*options)

// WithRequestTimeout bounds each request to the cluster (default 10s).
func WithRequestTimeout(d time.Duration) Option { return func(o *options) { o.requestTimeout = d } }

// WithMaxMetricsBytes bounds how much of /metrics is read (default 256 MiB).
func WithMaxMetricsBytes(n int64) Option { return func(o *options) { o.maxMetrics = n } }

// Resources are the group's resources whose stored objects must outlive the upgrade.
var Resources = []string{"deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"}

// CheckCluster reads what the cluster serves, stores, is asked for and runs, and judges it
// against target; a zero target means the release after the cluster's. It fails only when the
// cluster cannot be reached at all; a check it may not run is reported as Unknown.
func CheckCluster(ctx context.Context, c Conn, target Release, opts ...Option) (*Cluster, Release, error) {
	o := options{requestTimeout: defaultRequestTimeout, maxMetrics: 256 << 20}
	for _, opt := range opts {
		opt(&o)
	}
	logger := klog.FromContext(ctx)
	disc := discovery.ToDiscoveryInterfaceWithContext(c.Kube.Discovery())
	var server string
	var groups *metav1.APIGroupList
	if err := bounded(ctx, o, func(ctx context.Context) error {
		v, err := disc.ServerVersionWithContext(ctx)
		if err != nil {
			return fmt.Errorf("ask the API server its version: %w", err)
		}
		server = v.GitVersion
		return nil
	}); err != nil {
		return nil, target, err
	}
	if err := bounded(ctx, o, func(ctx context.Context) error {
		var err error
		groups, err = disc.ServerGroupsWithContext(ctx)
		return err
	}); err != nil {
		return nil, target, fmt.Errorf("discover API groups: %w", err)
	}
	served, err := resourceversion.Served(fixedGroups{groups})
	if err != nil {
		return nil, target, err
	}
	if target == (Release{}) {
		cur, err := ParseRelease(server)
		if err != nil {
			return nil, target, fmt.Errorf("the API server's version %q: %w; name the target with --to", server, err)
		}
		target = cur.Next()
	}
	logger.V(2).Info("Checking cluster", "server", server, "served", served, "target", target)
	cl := &Cluster{Versions: checkVersions(server, served, target)}
	cl.Storage = checkStorage(ctx, c, o, server, served, groupVersions(groups), target)
	cl.Clients = checkClients(ctx, c, o, target)
	cl.Install = checkInstall(ctx, c, o)
	return cl, target, nil
}

// fixedGroups answers discovery with the groups already read, so that every check sees the same
// answer and discovery is asked once.
type fixedGroups struct{ list *metav1.APIGroupList }

func (f fixedGroups) ServerGroups() (*metav1.APIGroupList, error) { return f.list, nil }

// groupVersions are the group versions served, e.g. "storagemigration.k8s.io/v1".
func groupVersions(groups *metav1.APIGroupList) map[string]bool {
	out := map[string]bool{}
	for _, g := range groups.Groups {
		for _, v := range g.Versions {
			out[v.GroupVersion] = true
		}
	}
	return out
}

// bounded runs one request with its own timeout.
func bounded(ctx context.Context, o options, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, o.requestTimeout)
	defer cancel()
	return f(ctx)
}

func checkVersions(server string, served []string, target Release) Versions {
	v := Versions{Status: Safe, Server: server, Served: served, Kept: Kept(target)}
	if v.Served == nil {
		v.Served = []string{}
	}
	for _, s := range served {
		if !slices.Contains(v.Kept, s) {
			v.Dropped = append(v.Dropped, s)
		}
	}
	if cur, err := ParseRelease(server); err == nil {
		switch {
		case !cur.Before(target):
			v.Notes = append(v.Notes, fmt.Sprintf("the cluster already runs %s", cur))
		case cur.Next().Before(target):
			v.Notes = append(v.Notes, fmt.Sprintf("the control plane goes up one minor release at a time (%s, then %s, ... %s): run kubectl dra preflight --to each", cur, cur.Next(), target))
		}
	}
	switch {
	case len(served) == 0:
		v.Notes = append(v.Notes, "the cluster serves no resource.k8s.io version: Dynamic Resource Allocation is off, nothing of it to break")
	case len(v.Dropped) == len(served):
		v.Status = NotSafe
		v.Notes = append(v.Notes, fmt.Sprintf("every version the cluster serves is gone in %s: enable %s/%s (--runtime-config) and move clients and manifests to it first", target, resourceversion.Group, v.Kept[0]))
	case len(v.Dropped) > 0:
		v.Notes = append(v.Notes, fmt.Sprintf("%s served now, gone in %s: whatever still uses it breaks (see clients and manifests)", join(v.Dropped), target))
	}
	return v
}

func join(vs []string) string {
	out := ""
	for i, v := range vs {
		if i > 0 {
			out += ", "
		}
		out += resourceversion.Group + "/" + v
	}
	return out
}

// gvr is the resource in the newest served version, for counting its objects.
func gvr(served []string, resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: resourceversion.Group, Version: served[0], Resource: resource}
}
