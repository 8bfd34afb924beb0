package app

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
)

type statusOptions struct {
	streams          genericiooptions.IOStreams
	flags            *genericclioptions.ConfigFlags
	clusterStateFile string
	selector         string
	node             string
	driverName       string
	allDrivers       bool
	output           string
	faultsConfigMap  string
}

func newStatusCommand(streams genericiooptions.IOStreams, flags *genericclioptions.ConfigFlags) *cobra.Command {
	o := &statusOptions{streams: streams, flags: flags, driverName: deviceschema.DefaultDriverName, faultsConfigMap: defaultFaultsNamespace + "/" + defaultFaultsConfigMap}
	cmd := &cobra.Command{
		Use:   "status [-l selector] [--node NODE] [-o wide|json|yaml]",
		Short: "Show every GPU: model, memory, health, and the claim and pod holding it",
		Long: `Lists the devices the driver publishes, node by node: model, memory, health (the taints
the driver or a DeviceTaintRule put on the device), and the claims and pods holding each device,
with the share and consumed capacity of shared devices. Then the totals per model.

STATE is free, allocated, shared (a device that allows several allocations holds at least one)
or blocked (a partition whose GPU's counters other partitions use up). HEALTH is ok or the
device's taints, and the simulated fault of the device where one is set (kubectl dra fault) but
the device carries no taint for it (the API server drops device taints before 1.36, unless
DRADeviceTaints is on); a device with a NoSchedule or NoExecute taint or such a fault counts as
UNHEALTHY in the totals, whether or not a claim holds it.

It reads with your credentials: ResourceSlices, ResourceClaims in all namespaces and, where the
cluster serves them, DeviceTaintRules, plus Nodes with -l or --node, each listed in pages (5,000
claims or nodes, 1,000 slices a request; from the API server's watch cache on Kubernetes 1.34 and
later); or all of them from --cluster-state (e.g. the output of "kubectl get
resourceslices,resourceclaims -A -o yaml").`,
		Example: `  # Every GPU of the cluster and who holds it
  kubectl dra status

  # Nodes of one group, with driver, pool, request, share and consumed capacity
  kubectl dra status -l gpu.example.com/group=a100 -o wide

  # Machine-readable
  kubectl dra status -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&o.clusterStateFile, "cluster-state", "", "read ResourceSlices, ResourceClaims, DeviceTaintRules and Nodes (YAML) from this file instead of a cluster")
	cmd.Flags().StringVarP(&o.selector, "selector", "l", "", "only devices usable from nodes with these labels (as kubectl get nodes -l)")
	cmd.Flags().StringVar(&o.node, "node", "", "only devices usable from this node")
	cmd.Flags().StringVar(&o.driverName, "driver-name", o.driverName, "DRA driver whose devices to show; also the domain of the model attribute and memory capacity")
	cmd.Flags().BoolVar(&o.allDrivers, "all-drivers", false, "show the devices of every DRA driver")
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "output format: wide, json or yaml (default: text)")
	cmd.Flags().StringVar(&o.faultsConfigMap, "faults-configmap", o.faultsConfigMap, "the chart's simulated faults (namespace/name), shown where readable; empty: none")
	return cmd
}

func (o *statusOptions) run(ctx context.Context) error {
	switch o.output {
	case "", "wide", "json", "yaml":
	default:
		return fmt.Errorf("-o %q: use wide, json or yaml, or leave it out for text", o.output)
	}
	if o.selector != "" {
		if _, err := labels.Parse(o.selector); err != nil {
			return fmt.Errorf("-l: %w", err)
		}
	}
	oneShotGC()
	state, notes, err := o.load(ctx)
	if err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintf(o.streams.ErrOut, "kubectl dra: %s\n", n)
	}
	sel := deviceusage.Selection{Driver: o.driverName}
	if o.allDrivers {
		sel.Driver = ""
	}
	if o.selector != "" || o.node != "" {
		sel.Nodes = o.selectNodes(state.Nodes)
		if len(sel.Nodes) == 0 {
			fmt.Fprintf(o.streams.ErrOut, "kubectl dra: no node matches%s\n", o.describeSelection())
		}
	}
	f := deviceusage.Build(state.fleetInput())
	if o.clusterStateFile == "" && o.faultsConfigMap != "" {
		for _, n := range o.markFaults(ctx, f) {
			fmt.Fprintf(o.streams.ErrOut, "kubectl dra: %s\n", n)
		}
	}
	rep := f.Report(sel)
	if o.output == "json" || o.output == "yaml" {
		return printStructured(o.streams.Out, o.output, rep)
	}
	if len(rep.Nodes) == 0 {
		what := "any driver"
		if sel.Driver != "" {
			what = "driver " + sel.Driver
		}
		fmt.Fprintf(o.streams.ErrOut, "No devices of %s published%s.\n", what, o.describeSelection())
	}
	// The table writer writes every cell and its padding on its own: unbuffered, the 40,000 rows
	// of a large fleet were half a million write calls, a third of the command's CPU.
	out := bufio.NewWriterSize(o.streams.Out, 64<<10)
	err = printStatus(out, rep, o.output == "wide")
	if ferr := out.Flush(); err == nil {
		err = ferr
	}
	return err
}

func (o *statusOptions) describeSelection() string {
	s := ""
	if o.node != "" {
		s += " --node " + o.node
	}
	if o.selector != "" {
		s += " -l " + o.selector
	}
	if s != "" {
		s = " (" + s[1:] + ")"
	}
	return s
}

func (o *statusOptions) load(ctx context.Context) (*clusterState, []string, error) {
	if o.clusterStateFile != "" {
		data, err := os.ReadFile(o.clusterStateFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--cluster-state: %w", err)
		}
		state, err := readClusterState(data)
		if err != nil {
			return nil, nil, fmt.Errorf("--cluster-state %s: %w", o.clusterStateFile, err)
		}
		return state, nil, nil
	}
	c, err := newReadClient(o.flags)
	if err != nil {
		return nil, nil, err
	}
	return c.list(ctx, listOptions{claims: true, nodes: o.selector != "" || o.node != "", nodeSelector: o.selector, nodeName: o.node}, o.streams.ErrOut)
}

// selectNodes applies -l and --node to the nodes read (the API server has already applied them to
// a live list). A --node that is not among them still selects its node-local devices: a state file
// need not hold Node objects.
func (o *statusOptions) selectNodes(nodes []*corev1.Node) []*corev1.Node {
	sel := labels.Everything()
	if o.selector != "" {
		sel, _ = labels.Parse(o.selector)
	}
	out := []*corev1.Node{}
	for _, n := range nodes {
		if (o.node == "" || n.Name == o.node) && sel.Matches(labels.Set(n.Labels)) {
			out = append(out, n)
		}
	}
	if len(out) == 0 && o.node != "" && o.selector == "" {
		out = append(out, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: o.node}})
	}
	return out
}

// printStructured writes v as indented JSON or as YAML.
func printStructured(out io.Writer, format string, v any) error {
	if format == "yaml" {
		data, err := sigsyaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = out.Write(data)
		return err
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (o *statusOptions) markFaults(ctx context.Context, f *deviceusage.Fleet) []string {
	ns, name, ok := strings.Cut(o.faultsConfigMap, "/")
	if !ok {
		return []string{fmt.Sprintf("--faults-configmap %q: want namespace/name", o.faultsConfigMap)}
	}
	cs, err := clientset(o.flags)
	if err != nil {
		return []string{fmt.Sprintf("simulated faults not shown: %v", err)}
	}
	ctx, cancel := context.WithTimeout(ctx, clusterTimeout)
	defer cancel()
	return markFaults(ctx, cs, ns, name, o.driverName, f)
}
