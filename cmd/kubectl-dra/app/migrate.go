package app

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/gpu-dra/gpu-dra/internal/migrate"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

type migrateOptions struct {
	streams     genericiooptions.IOStreams
	flags       *genericclioptions.ConfigFlags
	dryRun      bool
	method      string
	concurrency int
	timeout     time.Duration
	startWait   time.Duration
	output      string
}

// migrateReport is the JSON form of a run.
type migrateReport struct {
	DryRun    bool             `json:"dryRun"`
	Resources []migrate.Result `json:"resources"`
}

func newMigrateCommand(streams genericiooptions.IOStreams, flags *genericclioptions.ConfigFlags) *cobra.Command {
	o := &migrateOptions{streams: streams, flags: flags, method: string(migrate.Auto), concurrency: 4,
		timeout: 2 * time.Minute, startWait: 30 * time.Second}
	cmd := &cobra.Command{
		Use:   "migrate [--dry-run] [--method auto|storageversionmigration|rewrite]",
		Short: "Store every resource.k8s.io object again in the API server's current storage version",
		Long: `The API server keeps each object in etcd in the version it was written in until something
writes it again: DeviceClasses, ResourceClaims, ResourceClaimTemplates and ResourceSlices created
on Kubernetes 1.32 or 1.33 stay encoded as resource.k8s.io/v1beta1, and a release that no longer
serves v1beta1 (1.38) cannot read them. Run migrate on the newest release before leaving it.

For each resource.k8s.io resource the cluster serves (DeviceTaintRules too where served),
migrate creates a StorageVersionMigration where the cluster serves storagemigration.k8s.io, all
at once, and waits for them to succeed. When no migrator controller takes them up within
--controller-wait (or one fails, or takes longer than --timeout), or the API is not served,
migrate rewrites the objects itself: it lists the objects in pages and updates each unchanged, which the API server stores
re-encoded in its storage version (and does not store at all when the object is current).
Conflicts are retried after reading the object again; objects deleted meanwhile are skipped.

It needs list, get and update on resource.k8s.io, and create, get and delete on
storageversionmigrations.storagemigration.k8s.io where that is served. With --dry-run nothing is
stored: every update is a server-side dry run (validation and admission still run) and no
StorageVersionMigration is created. The exit status is 1 when an object could not be rewritten.`,
		Example: `  # What a migration would do, without storing anything
  kubectl dra migrate --dry-run

  # Migrate, rewriting the objects without waiting for a migrator controller
  kubectl dra migrate --method rewrite`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context())
		},
	}
	cmd.Flags().BoolVar(&o.dryRun, "dry-run", false, "store nothing: server-side dry-run updates, no StorageVersionMigration")
	cmd.Flags().StringVar(&o.method, "method", o.method, "auto (a StorageVersionMigration where possible, else a rewrite), storageversionmigration or rewrite")
	cmd.Flags().IntVar(&o.concurrency, "concurrency", o.concurrency, fmt.Sprintf("updates in flight at once (1 to %d)", migrate.MaxConcurrency))
	cmd.Flags().DurationVar(&o.timeout, "timeout", o.timeout, "longest wait for the StorageVersionMigrations to succeed; the objects of those that did not are rewritten")
	cmd.Flags().DurationVar(&o.startWait, "controller-wait", o.startWait, "how long a StorageVersionMigration may wait for a migrator controller before the objects are rewritten instead")
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "output format: json (default: text)")
	return cmd
}

func (o *migrateOptions) run(ctx context.Context) error {
	if o.output != "" && o.output != "json" {
		return fmt.Errorf("-o %q: use json, or leave it out for text", o.output)
	}
	if !slices.Contains(migrate.Methods, migrate.Method(o.method)) {
		return fmt.Errorf("--method %q: use one of %v", o.method, migrate.Methods)
	}
	if o.concurrency < 1 || o.concurrency > migrate.MaxConcurrency {
		return fmt.Errorf("--concurrency %d: use 1 to %d", o.concurrency, migrate.MaxConcurrency)
	}
	if o.timeout <= 0 || o.startWait <= 0 {
		return fmt.Errorf("--timeout %s, --controller-wait %s: both must be positive", o.timeout, o.startWait)
	}
	cfg, err := o.flags.ToRESTConfig()
	if err != nil {
		return err
	}
	// client-go's default of 5 requests a second would make a rewrite of thousands of objects take
	// minutes; --concurrency bounds the requests in flight, and the API server's priority and
	// fairness shares its capacity.
	cfg = rest.CopyConfig(cfg)
	cfg.QPS = -1
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	cs, err := clientset(o.flags)
	if err != nil {
		return err
	}
	m, err := migrate.New(client, cs.Discovery(), migrate.WithMethod(migrate.Method(o.method)), migrate.WithDryRun(o.dryRun),
		migrate.WithConcurrency(o.concurrency), migrate.WithMigrationTimeout(o.timeout), migrate.WithStartTimeout(o.startWait),
		migrate.WithProgress(func(resource, msg string) {
			fmt.Fprintf(o.streams.ErrOut, "kubectl dra: migrate %s: %s\n", resource, msg)
		}))
	if err != nil {
		return err
	}
	results, runErr := m.Run(ctx)
	if o.output == "json" {
		if err := printStructured(o.streams.Out, "json", migrateReport{DryRun: o.dryRun, Resources: results}); err != nil {
			return err
		}
	} else if len(results) > 0 {
		printMigration(o.streams.Out, results)
	}
	if runErr != nil {
		return runErr
	}
	return migrationVerdict(o.streams.Out, results, o.dryRun, o.output == "")
}

// printMigration writes one row per resource, then the notes and refusals.
func printMigration(out io.Writer, results []migrate.Result) {
	gv := resourceversion.Group + "/" + results[0].Version
	if results[0].DryRun {
		fmt.Fprintf(out, "Dry run of the migration to the API server's storage version (objects read and written as %s): "+
			"nothing stored; REWRITTEN counts the objects the API server would store again.\n\n", gv)
	} else {
		fmt.Fprintf(out, "Migration to the API server's storage version (objects read and written as %s):\n\n", gv)
	}
	w := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	fmt.Fprintln(w, "RESOURCE\tMETHOD\tOBJECTS\tREWRITTEN\tUNCHANGED\tGONE\tFAILED")
	for _, r := range results {
		counts := []string{"-", "-", "-", "-", "-"}
		if r.Method == migrate.Rewrite {
			counts = []string{strconv.Itoa(r.Objects), strconv.Itoa(r.Rewritten), strconv.Itoa(r.Unchanged), strconv.Itoa(r.Gone), strconv.Itoa(r.Failed)}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", r.Resource, r.Method, strings.Join(counts, "\t"))
	}
	_ = w.Flush()
	// A note shared by several resources (no migrator controller) is printed once.
	var notes []string
	noted := map[string][]string{}
	var refusals []string
	for _, r := range results {
		note := r.Note
		switch {
		case r.Migration != "":
			note = "StorageVersionMigration " + r.Migration + " succeeded"
		case note != "" && !r.DryRun:
			note += "; rewritten instead"
		}
		if note != "" {
			if noted[note] == nil {
				notes = append(notes, note)
			}
			noted[note] = append(noted[note], r.Resource)
		}
		for _, e := range r.Errors {
			refusals = append(refusals, r.Resource+" "+e)
		}
		if more := r.Failed - len(r.Errors); more > 0 {
			refusals = append(refusals, fmt.Sprintf("%s: %d more", r.Resource, more))
		}
	}
	for i, n := range notes {
		notes[i] = strings.Join(noted[n], ", ") + ": " + n
	}
	printSection(out, "Notes:", notes)
	printSection(out, "Refused:", refusals)
}

func printSection(out io.Writer, title string, lines []string) {
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(out, "\n%s\n", title)
	for _, l := range lines {
		fmt.Fprintf(out, "  %s\n", l)
	}
}

// migrationVerdict says in the text output whether every object is now current, and turns
// refused objects into exit status 1.
func migrationVerdict(out io.Writer, results []migrate.Result, dryRun, text bool) error {
	failed, rewritten := 0, 0
	for _, r := range results {
		failed += r.Failed
		rewritten += r.Rewritten
	}
	if failed > 0 {
		what := "could not be rewritten"
		if dryRun {
			what = "would be refused"
		}
		return exit(ExitFailed, "%d %s %s (see Refused): fix or delete them and run migrate again", failed, plural(failed, "object", "objects"), what)
	}
	if !text {
		return nil
	}
	if dryRun {
		fmt.Fprintf(out, "\nDry run: the API server accepts the rewrite of every object (%d); nothing was stored.\n", rewritten)
		return nil
	}
	fmt.Fprintf(out, "\nEvery %s object is stored in the API server's storage version.\n", resourceversion.Group)
	return nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
