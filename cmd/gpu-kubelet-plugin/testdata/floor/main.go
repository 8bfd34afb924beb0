// Command floor is the least a DRA kubelet plugin built on k8s.io/dynamic-resource-allocation can
// be: kubeletplugin.Start with a client-go clientset, eight published devices, and prepare and
// unprepare that only answer with CDI device IDs (no CDI spec, no checkpoint, no metrics, no
// inventory). BenchmarkPrepareUnprepare runs it next to gpu-kubelet-plugin on the same claims, so
// docs/performance.md can tell what the plugin adds from what the libraries cost.
//
// It takes the plugin's flags so the benchmark starts both alike; those it has no use for are
// accepted and ignored.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

type driver struct{ name string }

func (d driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		var r kubeletplugin.PrepareResult
		for _, res := range c.Status.Allocation.Devices.Results {
			r.Devices = append(r.Devices, kubeletplugin.Device{
				Requests: []string{res.Request}, PoolName: res.Pool, DeviceName: res.Device,
				CDIDeviceIDs: []string{fmt.Sprintf("k8s.%s/gpu=%s-%s", d.name, c.UID, res.Device)},
			})
		}
		out[c.UID] = r
	}
	return out, nil
}

func (driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

// WatchHealthStatus is never called: the health service is off, as in gpu-kubelet-plugin.
func (driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

func main() {
	klog.InitFlags(nil)
	name := flag.String("driver-name", "gpu.example.com", "")
	kubeconfig := flag.String("kubeconfig", "", "")
	registrar := flag.String("kubelet-registrar-dir", kubeletplugin.KubeletRegistryDir, "")
	plugins := flag.String("kubelet-plugins-dir", kubeletplugin.KubeletPluginsDir, "")
	qps := flag.Float64("kube-api-qps", 50, "")
	burst := flag.Int("kube-api-burst", 100, "")
	for _, ignored := range []string{"cdi-root", "health-probe-bind-address", "metrics-bind-address", "node-groups"} {
		flag.String(ignored, "", "ignored")
	}
	flag.Parse()
	if err := run(*name, os.Getenv("NODE_NAME"), *kubeconfig, *registrar, filepath.Join(*plugins, *name), float32(*qps), *burst); err != nil {
		klog.Background().Error(err, "floor plugin failed")
		os.Exit(1)
	}
}

func run(name, node, kubeconfig, registrar, dataDir string, qps float32, burst int) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = qps, burst
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return err
	}
	helper, err := kubeletplugin.Start(ctx, driver{name: name},
		kubeletplugin.DriverName(name), kubeletplugin.NodeName(node), kubeletplugin.KubeClient(clientset),
		kubeletplugin.RegistrarDirectoryPath(registrar), kubeletplugin.PluginDataDirectoryPath(dataDir),
		kubeletplugin.HealthService(false))
	if err != nil {
		return err
	}
	defer helper.Stop()
	var devices []resourceapi.Device
	for i := range 8 {
		devices = append(devices, resourceapi.Device{
			Name:       fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"index": {IntValue: ptr.To(int64(i))}},
		})
	}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		node: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}
