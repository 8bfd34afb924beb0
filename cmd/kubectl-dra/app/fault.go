package app

import (
	"context"
	"fmt"
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

	drahealth "github.com/gpu-dra/gpu-dra/driver/faults"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

// The chart's faults ConfigMap in a default install (helm install gpu-dra -n gpu-dra). Each node's
// faults are in a ConfigMap of their own, <it>-<node> (drahealth.ObjectName), which only that
// node's plugin watches; the chart's is empty and owns them.
const (
	defaultFaultsNamespace = "gpu-dra"
	defaultFaultsConfigMap = "gpu-dra-faults"
)

// fieldManager writes the nodes' faults ConfigMaps.
const fieldManager = "kubectl-dra"

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
		Use:   "fault set|clear NODE/DEVICE | fault list",
		Short: "Inject, clear or list simulated GPU faults",
		Long: `Writes a simulated fault of one GPU, with your credentials, into the node's own faults ConfigMap
(<release>-faults-<node>, labelled app.kubernetes.io/part-of=<release>-faults; the chart's
health.simulatedFaults), which only that node's kubelet plugin watches: created with the node's
first fault, deleted with its last. The plugin then, within seconds: taints the device in its
ResourceSlice (<driver>/unhealthy=<kind>, NoSchedule, or NoExecute for the chart's
faults.noExecuteKinds) where the API server keeps device taints, reports it Unhealthy to the
kubelet (the pods' status.containerStatuses[].allocatedResourcesStatus), and puts an Event on the
pods using it. "clear" removes the fault and with it the taint.

Kinds: xid (the GPU reported an XID error), fallen-off (it fell off the bus), attach-failure
(attaching the GPU to its node fails, in an attachable node group: each claim allocated the GPU
gets AttachFailed and the scheduler allocates again; the GPU is not tainted nor unhealthy).`,
		Example: `  # GPU 3 of node worker-1 reports an XID error
  kubectl dra fault set worker-1/gpu-3 --kind xid --message "XID 79: GPU has fallen off the bus"

  # It is fine again
  kubectl dra fault clear worker-1/gpu-3

  # Attaching GPU 0 of node worker-2 (an attachable node group) fails from now on
  kubectl dra fault set worker-2/gpu-0 --kind attach-failure --message "fabric link down"

  # Every node's faults
  kubectl dra fault list`,
	}
	set := &cobra.Command{
		Use:   "set NODE/DEVICE --kind xid|fallen-off|attach-failure [--message TEXT]",
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
	list := &cobra.Command{
		Use:   "list",
		Short: "List the simulated GPU faults of every node",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return o.list(cmd.Context()) },
	}
	for _, c := range []*cobra.Command{set, clear, list} {
		c.Flags().StringVarP(&o.namespace, "namespace", "n", o.namespace, "namespace of the chart's release")
		c.Flags().StringVar(&o.configMap, "configmap", o.configMap, "the chart's faults ConfigMap (<release>-faults); each node's faults are in <it>-<node>")
	}
	for _, c := range []*cobra.Command{set, clear} {
		c.Flags().StringVar(&o.driverName, "driver-name", o.driverName, "DRA driver whose device it is")
	}
	cmd.AddCommand(set, clear, list)
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
	if err := drahealth.ValidateBase(o.configMap); err != nil {
		return fmt.Errorf("--configmap: %w", err)
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
	return o.apply(ctx, cs, node, dev, fault, set)
}

// apply sets (or clears) fault of node's device dev.
func (o *faultOptions) apply(ctx context.Context, cs kubernetes.Interface, node, dev string, fault drahealth.Fault, set bool) error {
	anchor, err := o.anchor(ctx, cs)
	if err != nil {
		return err
	}
	if set {
		if err := o.checkPublished(ctx, cs, node, dev); err != nil {
			return err
		}
	}
	changed := false
	// Another writer may create, change or delete the node's object meanwhile: start again.
	err = retry.OnError(retry.DefaultRetry, func(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }, func() error {
		var err error
		changed, err = o.write(ctx, cs, anchor, node, func(faults drahealth.Faults) bool {
			_, had := faults[dev]
			if set {
				faults[dev] = fault
			} else {
				delete(faults, dev)
			}
			return set || had
		})
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

// anchor reads the chart's faults ConfigMap: it says that the release has simulated faults on, and
// owns the nodes' objects.
func (o *faultOptions) anchor(ctx context.Context, cs kubernetes.Interface) (*corev1.ConfigMap, error) {
	cm, err := cs.CoreV1().ConfigMaps(o.namespace).Get(ctx, o.configMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("ConfigMap %s/%s not found: install the chart with health.simulatedFaults=true (the default), or name the release's with -n and --configmap", o.namespace, o.configMap)
	}
	if err != nil {
		return nil, fmt.Errorf("read ConfigMap %s/%s: %w", o.namespace, o.configMap, err)
	}
	return cm, nil
}

// write applies change to node's faults in the node's own ConfigMap: created with its first fault,
// deleted with its last, and written only if change says so. A concurrent writer makes it fail
// with a conflict (resourceVersion) or AlreadyExists.
func (o *faultOptions) write(ctx context.Context, cs kubernetes.Interface, anchor *corev1.ConfigMap, node string, change func(drahealth.Faults) bool) (bool, error) {
	cms := cs.CoreV1().ConfigMaps(o.namespace)
	name := drahealth.ObjectName(o.configMap, node)
	cm, err := cms.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cm = nil
	case err != nil:
		return false, fmt.Errorf("read ConfigMap %s/%s: %w", o.namespace, name, err)
	}
	faults := drahealth.Faults{}
	if cm != nil {
		if faults, err = drahealth.ParseEntry(node, cm.Data[node], nil); err != nil {
			return false, fmt.Errorf("ConfigMap %s/%s: %w; fix it with `kubectl edit configmap -n %s %s`, or delete it", o.namespace, name, err, o.namespace, name)
		}
	}
	if !change(faults) {
		return false, nil
	}
	value, err := faults.Encode()
	if err != nil {
		return false, err
	}
	want := drahealth.NewObject(o.namespace, o.configMap, node, value, anchor)
	switch {
	case cm == nil && value == "":
		return true, nil
	case cm == nil:
		_, err = cms.Create(ctx, want, metav1.CreateOptions{FieldManager: fieldManager})
	case value == "":
		err = cms.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &cm.ResourceVersion}})
		if apierrors.IsNotFound(err) {
			err = nil
		}
	default:
		cm.Labels, cm.Data = want.Labels, want.Data
		if len(cm.OwnerReferences) == 0 {
			cm.OwnerReferences = want.OwnerReferences
		}
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: fieldManager})
	}
	return true, err
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
