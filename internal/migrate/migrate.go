package migrate

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
	"github.com/gpu-dra/gpu-dra/internal/rewriterecord"
)

// Method is how the objects of a resource get to the storage version.
type Method string

const (
	// Auto uses a StorageVersionMigration where the cluster serves the API and its controller
	// answers, else Rewrite.
	Auto Method = "auto"
	// StorageVersionMigration leaves the work to kube-controller-manager's migrator.
	StorageVersionMigration Method = "storageversionmigration"
	// Rewrite updates each object unchanged.
	Rewrite Method = "rewrite"
)

// Methods are the values a user may choose.
var Methods = []Method{Auto, StorageVersionMigration, Rewrite}

// Limits on the caller's choices: every run has a bounded cost.
const (
	MaxConcurrency = 16
	maxErrors      = 10
)

// Result is what happened to one resource's objects.
type Result struct {
	// Resource is the plural name ("resourceclaims"); Version the resource.k8s.io version its
	// objects were read and written in.
	Resource string `json:"resource"`
	Version  string `json:"version"`
	// Method is what did the work: StorageVersionMigration or Rewrite.
	Method Method `json:"method"`
	// Migration names the StorageVersionMigration that ran, if one did.
	Migration string `json:"migration,omitempty"`
	// Note says why a StorageVersionMigration did not do the work.
	Note string `json:"note,omitempty"`
	// Counts of a rewrite (zero after a StorageVersionMigration, which reports none). Rewritten
	// objects were stored anew; Unchanged ones were already in the storage version; Gone ones were
	// deleted meanwhile; Failed ones the API server refused, the first of them in Errors.
	Objects   int      `json:"objects"`
	Rewritten int      `json:"rewritten"`
	Unchanged int      `json:"unchanged"`
	Gone      int      `json:"gone"`
	Failed    int      `json:"failed"`
	Errors    []string `json:"errors,omitempty"`
	// DryRun: nothing was stored; Rewritten counts the objects the API server would accept.
	DryRun bool `json:"dryRun,omitempty"`
}

type options struct {
	method           Method
	dryRun           bool
	concurrency      int
	pageSize         int64
	requestTimeout   time.Duration
	startTimeout     time.Duration
	migrationTimeout time.Duration
	pollInterval     time.Duration
	progress         func(resource, message string)
}

// Option configures a Migrator.
type Option func(*options)

// WithMethod chooses how objects are migrated (default Auto).
func WithMethod(m Method) Option { return func(o *options) { o.method = m } }

// WithDryRun stores nothing: every rewrite is a server-side dry run, which still runs validation
// and admission, and no StorageVersionMigration is created.
func WithDryRun(dryRun bool) Option { return func(o *options) { o.dryRun = dryRun } }

// WithConcurrency bounds the updates in flight (default 4, at most MaxConcurrency).
func WithConcurrency(n int) Option { return func(o *options) { o.concurrency = n } }

// WithPageSize is the list page size of a rewrite (default 500).
func WithPageSize(n int64) Option { return func(o *options) { o.pageSize = n } }

// WithRequestTimeout bounds each request (default 30s).
func WithRequestTimeout(d time.Duration) Option { return func(o *options) { o.requestTimeout = d } }

// WithStartTimeout is how long a new StorageVersionMigration may stay without any condition
// before the migrator controller counts as not running and the objects are rewritten instead
// (default 30s).
func WithStartTimeout(d time.Duration) Option { return func(o *options) { o.startTimeout = d } }

// WithMigrationTimeout bounds the wait for the StorageVersionMigrations to succeed (default 2m);
// after it the objects of those that did not are rewritten instead. On an idle cluster a
// migration can stay Running for minutes.
func WithMigrationTimeout(d time.Duration) Option { return func(o *options) { o.migrationTimeout = d } }

// WithPollInterval is how often a StorageVersionMigration's status is read (default 1s).
func WithPollInterval(d time.Duration) Option { return func(o *options) { o.pollInterval = d } }

// WithProgress receives a line about a resource whenever work on it advances.
func WithProgress(f func(resource, message string)) Option {
	return func(o *options) { o.progress = f }
}

// Migrator migrates the resource.k8s.io objects of one cluster.
type Migrator struct {
	client    dynamic.Interface
	discovery discovery.DiscoveryInterface
	o         options
}

// New returns a Migrator that reads and writes through client and learns what the cluster serves
// from d.
func New(client dynamic.Interface, d discovery.DiscoveryInterface, opts ...Option) (*Migrator, error) {
	o := options{
		method: Auto, concurrency: 4, pageSize: 500, requestTimeout: 30 * time.Second,
		startTimeout: 30 * time.Second, migrationTimeout: 2 * time.Minute, pollInterval: time.Second,
		progress: func(string, string) {},
	}
	for _, opt := range opts {
		opt(&o)
	}
	if !slices.Contains(Methods, o.method) {
		return nil, fmt.Errorf("method %q: want one of %v", o.method, Methods)
	}
	if o.concurrency < 1 || o.concurrency > MaxConcurrency {
		return nil, fmt.Errorf("concurrency %d: want 1 to %d", o.concurrency, MaxConcurrency)
	}
	if o.pageSize < 1 {
		return nil, fmt.Errorf("page size %d: want at least 1", o.pageSize)
	}
	return &Migrator{client: client, discovery: d, o: o}, nil
}

// Run migrates the objects of every resource.k8s.io resource the cluster serves, in name order.
// An error means the work could not be done at all; objects the API server refused are counted
// in their Result. The resources whose every object was rewritten are recorded for kubectl dra
// preflight (rewriterecord), which cannot otherwise tell; a failure to record is a Note.
func (m *Migrator) Run(ctx context.Context) ([]Result, error) {
	results, err := m.run(ctx)
	if !m.o.dryRun {
		m.record(ctx, results)
	}
	return results, err
}

// record writes the record of the complete rewrites among results.
func (m *Migrator) record(ctx context.Context, results []Result) {
	var done []int
	for i, r := range results {
		if r.Method == Rewrite && r.Failed == 0 && r.Objects == r.Rewritten+r.Unchanged+r.Gone {
			done = append(done, i)
		}
	}
	if len(done) == 0 {
		return
	}
	err := func() error {
		v, err := m.discovery.ServerVersion()
		if err != nil {
			return fmt.Errorf("ask the API server its version: %w", err)
		}
		entries := map[string]rewriterecord.Entry{}
		now := time.Now().UTC().Truncate(time.Second)
		for _, i := range done {
			entries[results[i].Resource] = rewriterecord.Entry{Server: v.GitVersion, Version: results[i].Version, Objects: results[i].Objects, Completed: now}
		}
		rctx, cancel := context.WithTimeout(ctx, m.o.requestTimeout)
		defer cancel()
		return rewriterecord.Write(rctx, m.client, entries)
	}()
	if err != nil {
		for _, i := range done {
			results[i].Note = strings.TrimPrefix(results[i].Note+"; not recorded for kubectl dra preflight: "+err.Error(), "; ")
			m.o.progress(results[i].Resource, "not recorded for kubectl dra preflight: "+err.Error())
		}
	}
}

func (m *Migrator) run(ctx context.Context) ([]Result, error) {
	logger := klog.FromContext(ctx)
	version, resources, err := m.resources()
	if err != nil {
		return nil, err
	}
	svmVersion := ""
	if m.o.method != Rewrite {
		if svmVersion, err = m.storageMigrationVersion(); err != nil {
			return nil, err
		}
		if svmVersion == "" && m.o.method == StorageVersionMigration {
			return nil, fmt.Errorf("the cluster serves no %s version this tool knows (%v): choose method %s",
				storageMigrationGroup, storageMigrationVersions, Rewrite)
		}
	}
	logger.V(2).Info("Migrating", "version", version, "resources", len(resources), "storageMigrationVersion", svmVersion)
	var migrations map[string]migration
	if svmVersion != "" && !m.o.dryRun {
		migrations = m.migrateAll(ctx, svmVersion, version, resources)
	}
	var results []Result
	for _, res := range resources {
		gvr := schema.GroupVersionResource{Group: resourceversion.Group, Version: version, Resource: res}
		r := Result{Resource: res, Version: version, DryRun: m.o.dryRun}
		switch mig := migrations[res]; {
		case svmVersion != "" && m.o.dryRun:
			r.Note = fmt.Sprintf("%s/%s is served: a StorageVersionMigration runs first", storageMigrationGroup, svmVersion)
		case svmVersion != "" && mig.err == nil:
			r.Method, r.Migration = StorageVersionMigration, mig.name
			results = append(results, r)
			continue
		case svmVersion != "":
			if m.o.method == StorageVersionMigration || ctx.Err() != nil {
				return results, fmt.Errorf("%s: %w", res, mig.err)
			}
			r.Note = mig.err.Error()
			m.o.progress(res, mig.err.Error()+"; rewriting each object instead")
		}
		r.Method = Rewrite
		if err := m.rewrite(ctx, gvr, &r); err != nil {
			return append(results, r), fmt.Errorf("%s: %w", res, err)
		}
		results = append(results, r)
	}
	return results, nil
}

// migration is the outcome of one resource's StorageVersionMigration.
type migration struct {
	name string
	err  error
}

// migrateAll runs one StorageVersionMigration per resource, all at once: the migrator works on
// them in parallel, and the wait for a controller that does not run or for a migration that
// stalls is paid once, not once per resource.
func (m *Migrator) migrateAll(ctx context.Context, svmVersion, version string, resources []string) map[string]migration {
	out := make(map[string]migration, len(resources))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, res := range resources {
		wg.Go(func() {
			gvr := schema.GroupVersionResource{Group: resourceversion.Group, Version: version, Resource: res}
			name, err := m.viaStorageVersionMigration(ctx, svmVersion, gvr)
			mu.Lock()
			defer mu.Unlock()
			out[res] = migration{name: name, err: err}
		})
	}
	wg.Wait()
	return out
}

// resources discovers the newest resource.k8s.io version the cluster serves and the resources of
// it that can be listed and updated: every kind the release has (DeviceTaintRules only where
// served), without naming them here.
func (m *Migrator) resources() (string, []string, error) {
	version, err := resourceversion.Newest(m.discovery)
	if err != nil {
		return "", nil, err
	}
	gv := resourceversion.Group + "/" + version
	list, err := m.discovery.ServerResourcesForGroupVersion(gv)
	if err != nil {
		return "", nil, fmt.Errorf("discover the resources of %s: %w", gv, err)
	}
	var names []string
	for _, r := range list.APIResources {
		if strings.Contains(r.Name, "/") || !hasVerbs(r, "list", "get", "update") {
			continue
		}
		names = append(names, r.Name)
	}
	slices.Sort(names)
	return version, names, nil
}

func hasVerbs(r metav1.APIResource, verbs ...string) bool {
	for _, v := range verbs {
		if !slices.Contains(r.Verbs, v) {
			return false
		}
	}
	return true
}
