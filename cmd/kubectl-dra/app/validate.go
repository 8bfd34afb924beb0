package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/manifest"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

type validateOptions struct {
	streams   genericiooptions.IOStreams
	flags     *genericclioptions.ConfigFlags
	files     []string
	recursive bool
	// clusterStateFile holds the published ResourceSlices, DeviceClasses and Nodes to judge against.
	clusterStateFile string
	nodeGroupsFile   string
	driverName       string
	deny             []string
	output           string
}

func newValidateCommand(streams genericiooptions.IOStreams, flags *genericclioptions.ConfigFlags) *cobra.Command {
	o := &validateOptions{streams: streams, flags: flags, driverName: deviceschema.DefaultDriverName}
	cmd := &cobra.Command{
		Use:   "validate -f FILE|DIR|- [--cluster-state slices.yaml] [-o json]",
		Short: "Run the gpu-dra admission checks on ResourceClaimTemplates and ResourceClaims",
		Long: `Runs the checks of the gpu-dra validating webhook (the same code) on every
ResourceClaimTemplate and ResourceClaim in the input, in any resource.k8s.io version, after
applying the API server's defaults (allocationMode ExactCount, count 1).

The DeviceClasses and devices the checks look at come from --cluster-state (ResourceSlices,
DeviceClasses and optionally Nodes, any served version, as documents or as the List that
"kubectl get resourceslices,deviceclasses -o yaml" prints), or else from the current cluster
(--kubeconfig, --context). DeviceClasses in the input are added, as "kubectl apply" would create
them first. Without either, only the checks that need no cluster state run.

Exit status: 0 admitted (warnings may be printed), 2 when the webhook would deny an object,
1 when an object does not decode (the API server would reject it) or the command fails.`,
		Example: `  # In CI, against recorded ResourceSlices and DeviceClasses
  kubectl dra validate -f template.yaml --cluster-state slices.yaml

  # Against the current cluster, machine-readable
  kubectl dra validate -f manifests/ -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context())
		},
	}
	cmd.Flags().StringSliceVarP(&o.files, "filename", "f", nil, "manifest file, directory, or - for standard input (repeatable)")
	cmd.Flags().BoolVarP(&o.recursive, "recursive", "R", false, "process directories named with -f recursively")
	cmd.Flags().StringVar(&o.clusterStateFile, "cluster-state", "", "ResourceSlices and DeviceClasses (YAML) to validate against instead of a cluster")
	cmd.Flags().StringVar(&o.nodeGroupsFile, "node-groups", "", "the webhook's node-groups file, for the most devices a node holds (default: "+nodegroups.DefaultGroupDescription+")")
	cmd.Flags().StringVar(&o.driverName, "driver-name", o.driverName, "DRA driver name; also the attribute domain")
	cmd.Flags().StringSliceVar(&o.deny, "deny", nil, "rules that deny instead of warn, as the webhook's --deny: "+strings.Join(claimvalidation.RuleNames(), ", "))
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "output format: json (default: text)")
	return cmd
}

func servedList(served map[string]bool) string {
	var out []string
	for _, v := range resourceversion.Known {
		if served[v] {
			out = append(out, resourceversion.Group+"/"+v)
		}
	}
	if len(out) == 0 {
		return "no resource.k8s.io version"
	}
	return strings.Join(out, ", ")
}

// verdict is the outcome for one object; it is also the JSON output.
type verdict struct {
	File       string   `json:"file"`
	Document   int      `json:"document"`
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace,omitempty"`
	Name       string   `json:"name"`
	Allowed    bool     `json:"allowed"`
	Denied     []string `json:"denied,omitempty"`
	Warnings   []string `json:"warnings,omitempty"`
	Error      string   `json:"error,omitempty"`
}

type report struct {
	// ClusterState says what the class and feasibility checks looked at: "file:<path>",
	// "cluster" or "none". Its JSON name stays "inventory": scripts parse this output.
	ClusterState string    `json:"inventory"`
	Allowed      bool      `json:"allowed"`
	Objects      []verdict `json:"objects"`
}

func (o *validateOptions) run(ctx context.Context) error {
	if o.output != "" && o.output != "json" {
		return fmt.Errorf("-o %q: use json, or leave it out for text", o.output)
	}
	deny, err := claimvalidation.ParseRules(strings.Join(o.deny, ","))
	if err != nil {
		return fmt.Errorf("--deny: %w", err)
	}
	groups, err := nodegroups.LoadConfig(o.nodeGroupsFile)
	if err != nil {
		return fmt.Errorf("--node-groups: %w", err)
	}
	sources, err := readSources(o.files, o.recursive, o.streams.In)
	if err != nil {
		return err
	}
	source, where, served, err := o.published(ctx, sources)
	if err != nil {
		return err
	}
	rep, failed := judgeSources(ctx, claimvalidation.New(o.driverName, groups, deny, source), sources, served)
	rep.ClusterState = where
	if err := o.print(rep); err != nil {
		return err
	}
	return outcome(rep, failed)
}

// published is what the class and feasibility checks look at (nil for nothing), where it comes
// from, and the resource.k8s.io versions the cluster serves (nil when not asking a cluster).
func (o *validateOptions) published(ctx context.Context, sources []source) (feasibility.Lister, string, map[string]bool, error) {
	state, where, err := o.loadClusterState(ctx)
	if err != nil {
		return nil, "", nil, err
	}
	var served map[string]bool
	if where == "cluster" {
		// `kubectl apply` of a version the cluster does not serve fails before admission (e.g. a
		// 1.32 manifest on a default 1.34 cluster): report it with the way out.
		if served, err = servedVersions(o.flags); err != nil {
			return nil, "", nil, fmt.Errorf("discover the cluster's resource.k8s.io versions: %w", err)
		}
	}
	if state == nil {
		return nil, where, served, nil // a nil *inventory.Objects would not be a nil Lister
	}
	// Classes in the input exist by the time the claims are applied.
	for _, s := range sources {
		in, err := inventory.Read(manifest.Filter(s.Data, resourceversion.KindDeviceClass))
		if err != nil {
			return nil, "", nil, fmt.Errorf("%s: %w", s.Path, err)
		}
		state.Classes = append(state.Classes, in.Classes...)
	}
	return state, where, served, nil
}

// judgeSources judges every claim and template of sources; failed: some do not decode or are of
// a version the cluster does not serve (served, when set).
func judgeSources(ctx context.Context, validator *claimvalidation.Validator, sources []source, served map[string]bool) (report, bool) {
	rep := report{Allowed: true, Objects: []verdict{}}
	failed := false
	for _, s := range sources {
		for _, d := range manifest.Documents(s.Data) {
			v, ok := judge(ctx, validator, s.Path, d)
			if !ok {
				continue
			}
			if served != nil && v.Error == "" && !served[d.GVK.Version] {
				v.Allowed = false
				v.Error = fmt.Sprintf("the cluster does not serve %s (it serves %s); convert the manifest with: kubectl dra upgrade -f %s",
					v.APIVersion, servedList(served), s.Path)
			}
			if v.Error != "" {
				failed = true
			}
			rep.Allowed = rep.Allowed && v.Allowed
			rep.Objects = append(rep.Objects, v)
		}
	}
	return rep, failed
}

func (o *validateOptions) print(rep report) error {
	if o.output == "json" {
		enc := json.NewEncoder(o.streams.Out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printText(o.streams.Out, o.streams.ErrOut, rep)
	return nil
}

// outcome is the exit: failed when some object does not decode, denied when some would be denied.
func outcome(rep report, failed bool) error {
	denied := 0
	for _, v := range rep.Objects {
		if len(v.Denied) > 0 {
			denied++
		}
	}
	switch {
	case failed:
		return exit(ExitFailed, "some objects do not decode; the API server would reject them")
	case denied > 0:
		return exit(ExitDenied, "%d of %d object(s) would be denied", denied, len(rep.Objects))
	}
	return nil
}

// loadClusterState returns the published objects and a description of where they came from;
// nil when there are none (no --cluster-state and no reachable cluster).
func (o *validateOptions) loadClusterState(ctx context.Context) (*inventory.Objects, string, error) {
	if o.clusterStateFile != "" {
		data, err := os.ReadFile(o.clusterStateFile)
		if err != nil {
			return nil, "", fmt.Errorf("--cluster-state: %w", err)
		}
		state, err := inventory.Read(data)
		if err != nil {
			return nil, "", fmt.Errorf("--cluster-state %s: %w", o.clusterStateFile, err)
		}
		return state, "file:" + o.clusterStateFile, nil
	}
	state, err := liveClusterState(ctx, o.flags)
	if err != nil {
		if *o.flags.KubeConfig != "" || *o.flags.Context != "" || os.Getenv("KUBECONFIG") != "" {
			// The user asked for this cluster: not reaching it is an error, not a weaker check.
			return nil, "", fmt.Errorf("read the cluster's ResourceSlices and DeviceClasses: %w", err)
		}
		fmt.Fprintf(o.streams.ErrOut, "no --cluster-state and no reachable cluster (%v): DeviceClass and feasibility checks skipped\n", err)
		return nil, "none", nil
	}
	return state, "cluster", nil
}

// judge runs the webhook's checks on one document; ok is false for documents that are not
// claims or templates.
func judge(ctx context.Context, validator *claimvalidation.Validator, path string, d manifest.Document) (verdict, bool) {
	v := verdict{File: path, Document: d.Index, APIVersion: d.GVK.GroupVersion().String(), Kind: d.GVK.Kind, Namespace: d.Namespace, Name: d.Name}
	if d.Err != nil {
		v.Error = d.Err.Error()
		return v, true
	}
	if d.GVK.Group != resourceversion.Group || (d.GVK.Kind != resourceversion.KindClaim && d.GVK.Kind != resourceversion.KindTemplate) {
		return v, false
	}
	if !resourceversion.Supported(d.GVK) {
		v.Error = fmt.Sprintf("%s %s: version not supported; use one of %s", v.APIVersion, d.GVK.Kind, strings.Join(resourceversion.Known, ", "))
		return v, true
	}
	raw, err := sigsyaml.YAMLToJSON(d.Raw)
	if err != nil {
		v.Error = err.Error()
		return v, true
	}
	// The API server rejects unknown fields before any webhook runs (e.g. a v1beta1 request
	// layout sent as v1); say so instead of judging what the server would never admit.
	if err := manifest.CheckStrict(raw); err != nil {
		v.Error = err.Error()
		return v, true
	}
	obj, err := resourceversion.Decode(raw, schema.GroupVersionKind{})
	if err != nil {
		v.Error = err.Error()
		return v, true
	}
	res := validator.Validate(ctx, obj)
	v.Allowed = len(res.Errors) == 0
	v.Denied, v.Warnings = res.ErrorMessages(), res.WarningMessages()
	return v, true
}

func printText(out, errOut io.Writer, rep report) {
	for _, v := range rep.Objects {
		status := "ADMITTED"
		switch {
		case v.Error != "":
			status = "ERROR"
		case !v.Allowed:
			status = "DENIED"
		}
		name := v.Name
		if v.Namespace != "" {
			name = v.Namespace + "/" + v.Name
		}
		fmt.Fprintf(out, "%s %s %s (%s, %s document %d)\n", status, v.Kind, name, v.APIVersion, v.File, v.Document)
		if v.Error != "" {
			fmt.Fprintf(out, "  error: %s\n", v.Error)
		}
		for _, m := range v.Denied {
			fmt.Fprintf(out, "  denied: %s\n", m)
		}
		for _, m := range v.Warnings {
			fmt.Fprintf(out, "  warning: %s\n", m)
		}
	}
	if len(rep.Objects) == 0 {
		fmt.Fprintln(errOut, "no ResourceClaimTemplate or ResourceClaim found in the input")
	}
}
