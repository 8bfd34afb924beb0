package app

import (
	"context"
	"os"
	"runtime/debug"
	"time"

	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// clusterTimeout bounds every question to the cluster: a plugin that hangs on an unreachable
// API server is worse than one that says so. It is the default of --request-timeout, which bounds
// each request rather than a command: status and why list a large cluster in many pages, and a
// bound on all of them would be a bound on the cluster's size.
const clusterTimeout = 10 * time.Second

// oneShotGCPercent is the GOGC status and why run with where GOGC is not set. They read a
// cluster once, hold most of it until they print, and exit: at Go's default of 100 the collector
// took a sixth of why's CPU time at 5,000 nodes and 40,000 claims, and 200 saved most of that for
// a peak RSS a seventh higher (290 MiB to 330 MiB; docs/performance.md).
const oneShotGCPercent = 200

// oneShotGC sets oneShotGCPercent unless GOGC says otherwise.
func oneShotGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(oneShotGCPercent)
	}
}

// restConfig is the kubeconfig flags' client configuration, each request bounded by
// --request-timeout (clusterTimeout unless set; "0" is no bound, as for kubectl).
func restConfig(flags *genericclioptions.ConfigFlags) (*rest.Config, error) {
	cfg, err := flags.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	cfg = rest.CopyConfig(cfg)
	if flags.Timeout == nil || *flags.Timeout == "" {
		cfg.Timeout = clusterTimeout
	}
	return cfg, nil
}

// clientset talks to the cluster of the kubeconfig flags, each request bounded by
// --request-timeout.
func clientset(flags *genericclioptions.ConfigFlags) (kubernetes.Interface, error) {
	cfg, err := restConfig(flags)
	if err != nil {
		return nil, err
	}
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
