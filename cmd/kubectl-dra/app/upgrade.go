package app

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/internal/manifest"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

type upgradeOptions struct {
	streams   genericiooptions.IOStreams
	flags     *genericclioptions.ConfigFlags
	files     []string
	recursive bool
	to        string
	inPlace   bool
}

func newUpgradeCommand(streams genericiooptions.IOStreams, flags *genericclioptions.ConfigFlags) *cobra.Command {
	o := &upgradeOptions{streams: streams, flags: flags}
	cmd := &cobra.Command{
		Use:   "upgrade -f FILE|DIR|- [--to v1|v1beta2|v1beta1] [--in-place]",
		Short: "Rewrite ResourceClaimTemplates, ResourceClaims and DeviceClasses for another resource.k8s.io version",
		Long: `Rewrites every ResourceClaimTemplate, ResourceClaim and DeviceClass in the input for the
target resource.k8s.io version with the conversions the API server uses (v1beta1 request fields
such as deviceClassName and selectors move under "exactly:" in v1beta2 and v1, and back).
Other documents pass through byte for byte; comments and key order are kept. If a rewritten
document would not mean exactly what the API server's conversion produces, it is rendered from
the converted object instead and the summary says so.

The default target is the newest version the current cluster serves (--kubeconfig, --context),
or v1 when no cluster is reachable. A summary of what changed goes to standard error.`,
		Example: `  # Rewrite a Kubernetes 1.32 manifest for the current cluster
  kubectl dra upgrade -f old.yaml > new.yaml

  # Upgrade a directory of manifests to v1 in place
  kubectl dra upgrade -f manifests/ --to v1 --in-place

  # Back to the 1.32 layout
  cat template.yaml | kubectl dra upgrade -f - --to v1beta1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd)
		},
	}
	cmd.Flags().StringSliceVarP(&o.files, "filename", "f", nil, "manifest file, directory, or - for standard input (repeatable)")
	cmd.Flags().BoolVarP(&o.recursive, "recursive", "R", false, "process directories named with -f recursively")
	cmd.Flags().StringVar(&o.to, "to", "", "target version: "+strings.Join(resourceversion.Known, ", ")+" (default: newest the cluster serves, else v1)")
	cmd.Flags().BoolVarP(&o.inPlace, "in-place", "i", false, "rewrite the files instead of printing to standard output (a symbolic link's target, keeping its mode and owner)")
	return cmd
}

func (o *upgradeOptions) run(cmd *cobra.Command) error {
	ctx := cmd.Context()
	logger := klog.FromContext(ctx)
	if o.to != "" && !resourceversion.IsKnown(o.to) {
		return fmt.Errorf("--to %q: use one of %s", o.to, strings.Join(resourceversion.Known, ", "))
	}
	sources, err := readSources(o.files, o.recursive, o.streams.In)
	if err != nil {
		return err
	}
	if o.inPlace {
		for _, s := range sources {
			if s.Path == "-" {
				return fmt.Errorf("--in-place: cannot rewrite standard input; name files or directories with -f")
			}
		}
	}
	to := o.to
	if to == "" {
		v, err := newestServedVersion(o.flags)
		if err != nil {
			to = resourceversion.Known[0]
			fmt.Fprintf(o.streams.ErrOut, "no reachable cluster (%v); converting to %s\n", err, to)
		} else {
			to = v
			logger.V(2).Info("Target version from discovery", "version", to)
		}
	}

	failed := 0
	first := true
	for _, s := range sources {
		out, changes, convErr := manifest.Rewrite(s.Data, to)
		if out == nil {
			return convErr
		}
		for _, c := range changes {
			fmt.Fprintln(o.streams.ErrOut, describeChange(s.Path, c))
			if c.Action == manifest.Failed {
				failed++
			}
		}
		if o.inPlace {
			if !bytes.Equal(out, s.Data) && convErr == nil {
				if err := writeInPlace(s.Path, out, s.Mode); err != nil {
					return err
				}
			} else if convErr != nil {
				fmt.Fprintf(o.streams.ErrOut, "%s: not rewritten because of the errors above\n", s.Path)
			}
			continue
		}
		if err := writeStream(o.streams.Out, out, first); err != nil {
			return err
		}
		first = false
	}
	if failed > 0 {
		return exit(ExitFailed, "%d document(s) could not be converted; they were left unchanged", failed)
	}
	return nil
}

// writeStream appends one file's documents to the output, separated from the previous file's.
func writeStream(w io.Writer, data []byte, first bool) error {
	if !first && len(data) > 0 && !bytes.HasPrefix(data, []byte("---")) {
		if _, err := io.WriteString(w, "---\n"); err != nil {
			return err
		}
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		data = append(data, '\n')
	}
	_, err := w.Write(data)
	return err
}

// describeChange is the summary line of one document, e.g.
// "upgraded ResourceClaimTemplate default/example resource.k8s.io/v1beta1 → v1".
func describeChange(path string, c manifest.Change) string {
	where := ""
	if path != "-" {
		where = fmt.Sprintf(" (%s, document %d)", path, c.Document)
	} else {
		where = fmt.Sprintf(" (document %d)", c.Document)
	}
	what := "manifest"
	if c.Kind != "" {
		name := c.Name
		if c.Kind != resourceversion.KindDeviceClass {
			ns := c.Namespace
			if ns == "" {
				ns = "default"
			}
			name = ns + "/" + c.Name
		}
		what = c.Kind + " " + name
	}
	switch c.Action {
	case manifest.Converted:
		verb := "converted"
		if c.Upgraded() {
			verb = "upgraded"
		}
		line := fmt.Sprintf("%s %s %s/%s → %s%s", verb, what, resourceversion.Group, c.From, c.To, where)
		if c.Rendered {
			line += fmt.Sprintf("; re-rendered from the converted object, comments and key order not kept (%s)", c.Reason)
		}
		return line
	case manifest.Unchanged:
		return fmt.Sprintf("unchanged %s (already %s/%s)%s", what, resourceversion.Group, c.To, where)
	case manifest.Skipped:
		return fmt.Sprintf("skipped %s%s: %s", what, where, c.Reason)
	default:
		return fmt.Sprintf("error: %s%s: %v", what, where, c.Err)
	}
}
