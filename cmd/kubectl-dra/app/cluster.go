package app

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	draclient "k8s.io/dynamic-resource-allocation/client"

	"github.com/gpu-dra/gpu-dra/internal/servedversion"
	"github.com/gpu-dra/gpu-dra/webhook/manifest"
)

// clusterTimeout bounds every question to the cluster: a plugin that hangs on an unreachable
// API server is worse than one that says so.
const clusterTimeout = 10 * time.Second

// clientset talks to the cluster of the kubeconfig flags, each request bounded by clusterTimeout.
func clientset(flags *genericclioptions.ConfigFlags) (kubernetes.Interface, error) {
	cfg, err := flags.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = clusterTimeout
	return kubernetes.NewForConfig(cfg)
}

// servedVersions asks the cluster which resource.k8s.io versions it serves.
func servedVersions(flags *genericclioptions.ConfigFlags) (map[string]bool, error) {
	cs, err := clientset(flags)
	if err != nil {
		return nil, err
	}
	versions, err := servedversion.Served(cs.Discovery())
	if err != nil {
		return nil, err
	}
	served := map[string]bool{}
	for _, v := range versions {
		served[v] = true
	}
	return served, nil
}

// newestServedVersion returns the newest resource.k8s.io version the cluster serves that this
// tool converts to.
func newestServedVersion(flags *genericclioptions.ConfigFlags) (string, error) {
	cs, err := clientset(flags)
	if err != nil {
		return "", err
	}
	return servedversion.Newest(cs.Discovery())
}

// liveInventory lists the cluster's ResourceSlices and DeviceClasses in whichever version it
// serves, converted to v1 by k8s.io/dynamic-resource-allocation/client, and its Nodes.
func liveInventory(ctx context.Context, flags *genericclioptions.ConfigFlags) (*manifest.Inventory, error) {
	cs, err := clientset(flags)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, clusterTimeout)
	defer cancel()
	dra := draclient.New(cs)
	inv := &manifest.Inventory{}
	slices, err := dra.ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	for i := range slices.Items {
		inv.Slices = append(inv.Slices, &slices.Items[i])
	}
	classes, err := dra.DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list DeviceClasses: %w", err)
	}
	for i := range classes.Items {
		inv.Classes = append(inv.Classes, &classes.Items[i])
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Nodes: %w", err)
	}
	for i := range nodes.Items {
		inv.Nodes = append(inv.Nodes, &nodes.Items[i])
	}
	return inv, nil
}
