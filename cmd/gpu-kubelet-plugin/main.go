// Command gpu-kubelet-plugin is the node side of the gpu.example.com DRA driver: it registers with
// the kubelet, publishes the node's GPUs as ResourceSlices and prepares claims through CDI.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/app"
	"github.com/gpu-dra/gpu-dra/driver/cdi"
)

func main() {
	var o app.Options
	klog.InitFlags(nil)
	flag.StringVar(&o.DriverName, "driver-name", "gpu.example.com", "DRA driver name; also the DeviceClass's driver and the attribute domain.")
	flag.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "Node this plugin runs on (default: env NODE_NAME, from the downward API spec.nodeName).")
	flag.StringVar(&o.PodUID, "pod-uid", os.Getenv("POD_UID"), "UID of this pod (default: env POD_UID, from metadata.uid); enables rolling updates; empty disables them.")
	flag.StringVar(&o.Kubeconfig, "kubeconfig", "", "Kubeconfig file; empty means in-cluster config.")
	flag.StringVar(&o.InventoryConfig, "inventory-config", "", "Node-group inventory file (YAML); empty means 8 default GPUs per node.")
	flag.StringVar(&o.RegistrarDir, "kubelet-registrar-dir", kubeletplugin.KubeletRegistryDir, "Directory where the kubelet watches for plugin registration sockets.")
	flag.StringVar(&o.PluginsDir, "kubelet-plugins-dir", kubeletplugin.KubeletPluginsDir, "Parent of the plugin data directory (<dir>/<driver name>: DRA socket, checkpoint).")
	flag.StringVar(&o.CDIRoot, "cdi-root", cdi.DefaultRoot, "Directory for CDI spec files; the container runtime must read it.")
	flag.StringVar(&o.HealthAddr, "health-addr", ":8081", "Address of the liveness endpoint /healthz; empty disables it.")
	flag.StringVar(&o.MetricsAddr, "metrics-addr", ":8080", "Address of the Prometheus endpoint /metrics; empty disables it.")
	flag.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", 0, "Bound on ResourceSlice cleanup after SIGTERM (default 20s).")
	flag.DurationVar(&o.InventoryPollInterval, "inventory-poll-interval", 10*time.Second, "How often --inventory-config is re-read; a change re-publishes the node's devices.")
	qps := flag.Float64("kube-api-qps", 50, "Queries per second to the API server (each prepare reads its claims).")
	flag.IntVar(&o.KubeAPIBurst, "kube-api-burst", 100, "Burst of queries to the API server.")
	deleteAll := flag.Bool("delete-all-slices", false, "Delete every node's ResourceSlices of --driver-name and exit (the chart's pre-delete hook).")
	flag.Parse()
	o.KubeAPIQPS = float32(*qps)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	run := app.Run
	if *deleteAll {
		run = app.DeleteAllSlices
	}
	if err := run(ctx, o); err != nil {
		klog.Background().Error(err, "gpu-kubelet-plugin failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
