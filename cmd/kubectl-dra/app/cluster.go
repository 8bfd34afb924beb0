package app

import (
	"context"
	"time"

	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
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
	versions, err := resourceversion.Served(cs.Discovery())
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
	return resourceversion.Newest(cs.Discovery())
}

// liveClusterState lists what the cluster publishes, bounded by clusterTimeout.
func liveClusterState(ctx context.Context, flags *genericclioptions.ConfigFlags) (*inventory.Objects, error) {
	cs, err := clientset(flags)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, clusterTimeout)
	defer cancel()
	return inventory.List(ctx, cs)
}
