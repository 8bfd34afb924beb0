package inventory

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	draclient "k8s.io/dynamic-resource-allocation/client"
)

// List reads the cluster's ResourceSlices and DeviceClasses in whichever version it serves,
// converted to v1 by k8s.io/dynamic-resource-allocation/client, and its Nodes: one list call each.
func List(ctx context.Context, cs kubernetes.Interface) (*Objects, error) {
	dra := draclient.New(cs)
	out := &Objects{}
	var err error
	if out.Slices, err = ListSlices(ctx, dra); err != nil {
		return nil, err
	}
	if out.Classes, err = ListClasses(ctx, dra); err != nil {
		return nil, err
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

// ListSlices reads every ResourceSlice, converted to v1. One client serves several lists: it
// remembers which version the server answered.
func ListSlices(ctx context.Context, dra *draclient.Client) ([]*resourceapi.ResourceSlice, error) {
	slices, err := dra.ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	out := make([]*resourceapi.ResourceSlice, 0, len(slices.Items))
	for i := range slices.Items {
		out = append(out, &slices.Items[i])
	}
	return out, nil
}

// ListClasses reads every DeviceClass, converted to v1.
func ListClasses(ctx context.Context, dra *draclient.Client) ([]*resourceapi.DeviceClass, error) {
	classes, err := dra.DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list DeviceClasses: %w", err)
	}
	out := make([]*resourceapi.DeviceClass, 0, len(classes.Items))
	for i := range classes.Items {
		out = append(out, &classes.Items[i])
	}
	return out, nil
}
