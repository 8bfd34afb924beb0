package app

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/structured"

	drahealth "github.com/gpu-dra/gpu-dra/driver/faults"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
)

// faultsPageSize is how many nodes' faults ConfigMaps one list request returns.
const faultsPageSize = 500

// listFaults reads every node's faults ConfigMap of base, by label, a page at a time. An object
// that is not a node's (its name does not match its key) or whose entry does not parse is a note.
func listFaults(ctx context.Context, cs kubernetes.Interface, namespace, base string) (map[string]drahealth.Faults, []string, error) {
	out := map[string]drahealth.Faults{}
	var notes []string
	opts := metav1.ListOptions{LabelSelector: drahealth.Selector(base), Limit: faultsPageSize}
	for {
		list, err := cs.CoreV1().ConfigMaps(namespace).List(ctx, opts)
		if err != nil {
			return nil, nil, fmt.Errorf("list the faults ConfigMaps in %s (%s): %w", namespace, opts.LabelSelector, err)
		}
		for i := range list.Items {
			node, faults, err := nodeFaults(base, &list.Items[i])
			if err != nil {
				notes = append(notes, err.Error())
				continue
			}
			out[node] = faults
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return out, notes, nil
		}
	}
}

func nodeFaults(base string, cm *corev1.ConfigMap) (string, drahealth.Faults, error) {
	node, ok := drahealth.NodeOf(base, cm)
	if !ok {
		return "", nil, fmt.Errorf("ConfigMap %s/%s holds no node's faults (want the key <node> in the ConfigMap %s-<node>); delete it", cm.Namespace, cm.Name, base)
	}
	faults, err := drahealth.ParseEntry(node, cm.Data[node], nil)
	if err != nil {
		return "", nil, fmt.Errorf("ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return node, faults, nil
}

// list prints every node's faults, by node and device.
func (o *faultOptions) list(ctx context.Context) error {
	if err := drahealth.ValidateBase(o.configMap); err != nil {
		return fmt.Errorf("--configmap: %w", err)
	}
	cs, err := clientset(o.flags)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, clusterTimeout)
	defer cancel()
	return o.printList(ctx, cs)
}

func (o *faultOptions) printList(ctx context.Context, cs kubernetes.Interface) error {
	if _, err := o.anchor(ctx, cs); err != nil {
		return err
	}
	byNode, notes, err := listFaults(ctx, cs, o.namespace, o.configMap)
	if err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintf(o.streams.ErrOut, "kubectl dra: %s\n", n)
	}
	if len(byNode) == 0 {
		fmt.Fprintln(o.streams.Out, "No faults.")
		return nil
	}
	w := tabwriter.NewWriter(o.streams.Out, 0, 8, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tDEVICE\tKIND\tSINCE\tMESSAGE")
	for _, node := range slices.Sorted(maps.Keys(byNode)) {
		faults := byNode[node]
		for _, dev := range slices.Sorted(maps.Keys(faults)) {
			f := faults[dev]
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", node, dev, f.Kind, f.Time.UTC().Format("2006-01-02T15:04:05Z"), f.Message)
		}
	}
	return w.Flush()
}

// markFaults adds the nodes' simulated faults (the faults ConfigMaps of namespace/name) to the
// fleet's devices, so that status shows a fault also where the API server drops device taints.
// Best effort: without the right to list them nothing is added, and a bad entry is a note.
func markFaults(ctx context.Context, cs kubernetes.Interface, namespace, name, driver string, f *deviceusage.Fleet) []string {
	byNode, notes, err := listFaults(ctx, cs, namespace, name)
	if err != nil {
		if !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
			return []string{fmt.Sprintf("simulated faults not shown: %v", err)}
		}
		return nil
	}
	applyFaults(byNode, driver, f)
	return notes
}

func applyFaults(byNode map[string]drahealth.Faults, driver string, f *deviceusage.Fleet) {
	for node, faults := range byNode {
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
}
