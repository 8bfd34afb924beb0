package published

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	draclient "k8s.io/dynamic-resource-allocation/client"
)

// List reads the cluster's ResourceSlices and DeviceClasses in whichever version it serves,
// converted to v1 by k8s.io/dynamic-resource-allocation/client, and its Nodes: one list call each.
func List(ctx context.Context, cs kubernetes.Interface) (*Objects, error) {
	dra := draclient.New(cs)
	out := &Objects{}
	slices, err := dra.ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	for i := range slices.Items {
		out.Slices = append(out.Slices, &slices.Items[i])
	}
	classes, err := dra.DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list DeviceClasses: %w", err)
	}
	for i := range classes.Items {
		out.Classes = append(out.Classes, &classes.Items[i])
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Nodes: %w", err)
	}
	for i := range nodes.Items {
		out.Nodes = append(out.Nodes, &nodes.Items[i])
	}
	return out, nil
}
