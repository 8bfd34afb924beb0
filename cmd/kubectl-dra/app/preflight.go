package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/gpu-dra/gpu-dra/internal/upgradecheck"
)

// Exit codes of preflight, besides 0 (safe) and ExitFailed.
const (
	// ExitNotSafe: preflight found something the target release breaks.
	ExitNotSafe = 2
	// ExitUnknown: nothing found that breaks, but a check could not tell (no permission, API not
	// served).
	ExitUnknown = 3
)

type preflightOptions struct {
	streams   genericiooptions.IOStreams
	flags     *genericclioptions.ConfigFlags
	to        string
	files     []string
	recursive bool
	output    string
	// connect opens the cluster's connections; tests replace it.
	connect func() (upgradecheck.Conn, error)
}

func newPreflightCommand(streams genericiooptions.IOStreams, flags *genericclioptions.ConfigFlags) *cobra.Command {
	o := &preflightOptions{streams: streams, flags: flags}
	o.connect = func() (upgradecheck.Conn, error) { return preflightConn(flags) }
	cmd := &cobra.Command{
		Use:   "preflight [--to 1.38] [-f FILE|DIR|-] [-o json]",
		Short: "Tell whether upgrading the control plane to a Kubernetes release would break DRA",
		Long: `Reads the cluster (--kubeconfig, --context) and any manifests named with -f, and reports what
the target Kubernetes release would break, without changing anything:

  versions   the resource.k8s.io versions the cluster serves and those the target keeps
             (from the API types' lifecycle: v1beta1 ends in 1.38, v1beta2 in 1.39)
  storage    whether objects written by older releases were rewritten in the current storage
             version (from storagemigration.k8s.io where served; else the command to run)
  clients    deprecated versions clients requested since the API server started (its
             apiserver_requested_deprecated_apis metric, when you may read /metrics)
  install    the gpu-dra chart's workloads, their release and images, and whether they run on it
  manifests  documents of the -f files in a version the target no longer serves, each with the
             kubectl dra upgrade line that fixes it

The default target is the release after the cluster's (or 1.38 without a cluster). Without
-f the cluster is required; with -f and no reachable cluster only the files are checked.

Exit status: 0 safe, 2 not safe, 3 nothing found that breaks but a check could not tell
(e.g. no permission to read /metrics), 1 the command failed.`,
		Example: `  # Before upgrading the control plane to 1.38
  kubectl dra preflight --to 1.38

  # Manifests in a repository, no cluster needed
  kubectl dra preflight --to 1.38 -f deploy/ -R -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&o.to, "to", "", "target Kubernetes release, e.g. 1.38 (default: the release after the cluster's, else "+upgradecheck.FirstRemoval().String()+")")
	cmd.Flags().StringSliceVarP(&o.files, "filename", "f", nil, "manifest file, directory, or - for standard input (repeatable)")
	cmd.Flags().BoolVarP(&o.recursive, "recursive", "R", false, "process directories named with -f recursively")
	cmd.Flags().StringVarP(&o.output, "output", "o", "text", "output format: text or json")
	return cmd
}

func (o *preflightOptions) run(ctx context.Context) error {
	if o.output != "text" && o.output != "json" {
		return fmt.Errorf("-o %q: use text or json", o.output)
	}
	var target upgradecheck.Release
	if o.to != "" {
		var err error
		if target, err = upgradecheck.ParseRelease(o.to); err != nil {
			return fmt.Errorf("--to: %w", err)
		}
	}
	var sources []upgradecheck.Source
	if len(o.files) > 0 {
		in, err := readSources(o.files, o.recursive, o.streams.In)
		if err != nil {
			return err
		}
		for _, s := range in {
			sources = append(sources, upgradecheck.Source{Path: s.Path, Data: s.Data})
		}
	}
	rep, err := o.check(ctx, target, sources)
	if err != nil {
		return err
	}
	if err := printPreflight(o.streams.Out, o.output, rep); err != nil {
		return err
	}
	return preflightExit(rep)
}

// check builds the report: the cluster's part when one is reachable (or required), the files'.
func (o *preflightOptions) check(ctx context.Context, target upgradecheck.Release, sources []upgradecheck.Source) (*upgradecheck.Report, error) {
	conn, err := o.connect()
	var cl *upgradecheck.Cluster
	if err == nil {
		cl, target, err = upgradecheck.CheckCluster(ctx, conn, target, upgradecheck.WithRequestTimeout(clusterTimeout))
	}
	skipped := ""
	if err != nil {
		explicit := *o.flags.KubeConfig != "" || *o.flags.Context != "" || os.Getenv("KUBECONFIG") != ""
		if len(sources) == 0 || explicit {
			return nil, fmt.Errorf("read the cluster: %w", err)
		}
		skipped = fmt.Sprintf("no reachable cluster (%v): only the files were checked", err)
	}
	return upgradecheck.NewReport(target, cl, skipped, sources), nil
}

// preflightConn connects to the cluster of the kubeconfig flags, each request bounded.
func preflightConn(flags *genericclioptions.ConfigFlags) (upgradecheck.Conn, error) {
	cfg, err := flags.ToRESTConfig()
	if err != nil {
		return upgradecheck.Conn{}, err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = clusterTimeout
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return upgradecheck.Conn{}, err
	}
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return upgradecheck.Conn{}, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return upgradecheck.Conn{}, err
	}
	rc := kube.Discovery().RESTClient()
	return upgradecheck.Conn{Kube: kube, Metadata: meta, Dynamic: dyn, Metrics: func(ctx context.Context) (io.ReadCloser, error) {
		return rc.Get().AbsPath("/metrics").SetHeader("Accept", "text/plain").Stream(ctx)
	}}, nil
}

func preflightExit(rep *upgradecheck.Report) error {
	switch rep.Verdict {
	case upgradecheck.NotSafe:
		return exit(ExitNotSafe, "not safe to upgrade to Kubernetes %s", rep.Target)
	case upgradecheck.Unknown:
		return exit(ExitUnknown, "could not tell whether upgrading to Kubernetes %s is safe", rep.Target)
	}
	return nil
}

func printPreflight(w io.Writer, format string, rep *upgradecheck.Report) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return printPreflightText(w, rep)
}
