package app

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/dynamic-resource-allocation/structured"

	drahealth "github.com/gpu-dra/gpu-dra/driver/faults"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
)

// The chart's faults ConfigMap in a default install (helm install gpu-dra -n gpu-dra).
const (
	defaultFaultsNamespace = "gpu-dra"
	defaultFaultsConfigMap = "gpu-dra-faults"
)

type faultOptions struct {
	streams    genericiooptions.IOStreams
	flags      *genericclioptions.ConfigFlags
	namespace  string
	configMap  string
	driverName string
	kind       string
	message    string
}

func newFaultCommand(streams genericiooptions.IOStreams, flags *genericclioptions.ConfigFlags) *cobra.Command {
	o := &faultOptions{streams: streams, flags: flags, namespace: defaultFaultsNamespace, configMap: defaultFaultsConfigMap, driverName: deviceschema.DefaultDriverName}
	cmd := &cobra.Command{
		Use:   "fault set|clear NODE/DEVICE",
		Short: "Inject or clear a simulated GPU fault",
		Long: `Writes a simulated fault of one GPU into the chart's faults ConfigMap (health.simulatedFaults),
with your credentials. The node's kubelet plugin then, within seconds: taints the device in its
ResourceSlice (<driver>/unhealthy=<kind>, NoSchedule, or NoExecute for the chart's
faults.noExecuteKinds) where the API server keeps device taints, reports it Unhealthy to the
kubelet (the pods' status.containerStatuses[].allocatedResourcesStatus), and puts an Event on the
pods using it. "clear" removes the fault and with it the taint.

Kinds: xid (the GPU reported an XID error), fallen-off (it fell off the bus).`,
		Example: `  # GPU 3 of node worker-1 reports an XID error
  kubectl dra fault set worker-1/gpu-3 --kind xid --message "XID 79: GPU has fallen off the bus"

  # It is fine again
  kubectl dra fault clear worker-1/gpu-3`,
	}
	set := &cobra.Command{
		Use:   "set NODE/DEVICE --kind xid|fallen-off [--message TEXT]",
		Short: "Mark a GPU faulty",
		Args:  cobra.ExactArgs(1),
		RunE:  func(cmd *cobra.Command, args []string) error { return o.run(cmd.Context(), args[0], true) },
	}
	set.Flags().StringVar(&o.kind, "kind", "", "fault kind: "+strings.Join(drahealth.KindNames(), ", "))
	set.Flags().StringVar(&o.message, "message", "", fmt.Sprintf("what happened, for people (at most %d bytes)", drahealth.MaxMessageLength))
	clear := &cobra.Command{
		Use:   "clear NODE/DEVICE",
		Short: "Clear a GPU's fault",
		Args:  cobra.ExactArgs(1),
		RunE:  func(cmd *cobra.Command, args []string) error { return o.run(cmd.Context(), args[0], false) },
	}
	for _, c := range []*cobra.Command{set, clear} {
		c.Flags().StringVarP(&o.namespace, "namespace", "n", o.namespace, "namespace of the chart's release")
		c.Flags().StringVar(&o.configMap, "configmap", o.configMap, "the faults ConfigMap (<release>-faults)")
		c.Flags().StringVar(&o.driverName, "driver-name", o.driverName, "DRA driver whose device it is")
	}
	cmd.AddCommand(set, clear)
	return cmd
}

// parseDeviceRef splits NODE/DEVICE.
func parseDeviceRef(ref string) (string, string, error) {
	node, dev, ok := strings.Cut(ref, "/")
	switch {
	case !ok || node == "" || dev == "":
		return "", "", fmt.Errorf("%q: want NODE/DEVICE, e.g. worker-1/gpu-3", ref)
	case len(validation.IsDNS1123Subdomain(node)) > 0:
		return "", "", fmt.Errorf("%q: %q is not a node name", ref, node)
	case len(validation.IsDNS1123Label(dev)) > 0:
		return "", "", fmt.Errorf("%q: %q is not a device name (a DNS label such as gpu-3)", ref, dev)
	}
	return node, dev, nil
}

func (o *faultOptions) run(ctx context.Context, ref string, set bool) error {
	node, dev, err := parseDeviceRef(ref)
	if err != nil {
		return err
	}
	fault := drahealth.Fault{Time: metav1.NewTime(time.Now().UTC().Truncate(time.Second)), Message: o.message}
	if set {
		if fault.Kind, err = drahealth.ParseKind(o.kind); err != nil {
			return fmt.Errorf("--kind: %w", err)
		}
		if err := (drahealth.Faults{dev: fault}).Validate(node, nil); err != nil {
			return fmt.Errorf("--message: %w", err)
		}
	}
	cs, err := clientset(o.flags)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, clusterTimeout)
	defer cancel()
	if set {
		if err := o.checkPublished(ctx, cs, node, dev); err != nil {
			return err
		}
	}
	changed := false
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cs.CoreV1().ConfigMaps(o.namespace).Get(ctx, o.configMap, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("ConfigMap %s/%s not found: install the chart with health.simulatedFaults=true (the default), or name the release's with -n and --configmap", o.namespace, o.configMap)
		}
		if err != nil {
			return fmt.Errorf("read ConfigMap %s/%s: %w", o.namespace, o.configMap, err)
		}
		faults, err := drahealth.ParseEntry(node, cm.Data[node], nil)
		if err != nil {
			return fmt.Errorf("%w; fix or delete the key with `kubectl edit configmap -n %s %s`", err, o.namespace, o.configMap)
		}
		_, had := faults[dev]
		if set {
			faults[dev] = fault
		} else {
			delete(faults, dev)
		}
		changed = set || had
		if !changed {
			return nil
		}
		value, err := faults.Encode()
		if err != nil {
			return err
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		if value == "" {
			delete(cm.Data, node)
		} else {
			cm.Data[node] = value
		}
		_, err = cs.CoreV1().ConfigMaps(o.namespace).Update(ctx, cm, metav1.UpdateOptions{FieldManager: "kubectl-dra"})
		return err
	})
	if err != nil {
		return err
	}
	switch {
	case set:
		fmt.Fprintf(o.streams.Out, "Fault %s set on %s/%s; its plugin reports it within seconds (kubectl dra status --node %s).\n", fault.Kind, node, dev, node)
	case changed:
		fmt.Fprintf(o.streams.Out, "Fault of %s/%s cleared.\n", node, dev)
	default:
		fmt.Fprintf(o.streams.Out, "%s/%s has no fault.\n", node, dev)
	}
	return nil
}

// checkPublished refuses a device the node's ResourceSlices do not publish; the plugin would
// reject the whole entry. Without permission to list slices it only warns.
func (o *faultOptions) checkPublished(ctx context.Context, cs kubernetes.Interface, node, dev string) error {
	list, err := draclient.New(cs).ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node + ",spec.driver=" + o.driverName})
	if err != nil {
		fmt.Fprintf(o.streams.ErrOut, "kubectl dra: cannot check that %s publishes %s (%v); writing the fault anyway\n", node, dev, err)
		return nil
	}
	var names []string
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			if d.Name == dev {
				return nil
			}
			names = append(names, d.Name)
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("node %s publishes no devices of driver %s (is it the node's name, is the plugin running there?)", node, o.driverName)
	}
	slices.Sort(names)
	return fmt.Errorf("node %s publishes no device %s of driver %s; it publishes %s", node, dev, o.driverName, joinMax(names, 8))
}

// markFaults adds the faults of the chart's ConfigMap to the fleet's devices, so that status shows
// a fault also where the API server drops device taints. Best effort: without the ConfigMap (or
// the right to read it) nothing is added, and a bad entry is a note.
func markFaults(ctx context.Context, cs kubernetes.Interface, namespace, name, driver string, f *deviceusage.Fleet) []string {
	cm, err := cs.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
			return []string{fmt.Sprintf("simulated faults not shown: %v", err)}
		}
		return nil
	}
	return applyFaults(cm, driver, f)
}

func applyFaults(cm *corev1.ConfigMap, driver string, f *deviceusage.Fleet) []string {
	var notes []string
	for _, node := range slices.Sorted(maps.Keys(cm.Data)) {
		faults, err := drahealth.ParseEntry(node, cm.Data[node], nil)
		if err != nil {
			notes = append(notes, fmt.Sprintf("ConfigMap %s/%s: %v", cm.Namespace, cm.Name, err))
			continue
		}
		for dev, fault := range faults {
			// The plugin names its pool after its node.
			if d := f.Device(structured.MakeDeviceID(driver, node, dev)); d != nil {
				d.Fault = string(fault.Kind)
				if fault.Message != "" {
					d.Fault += ": " + fault.Message
				}
				d.Healthy = false
			}
		}
	}
	return notes
}
