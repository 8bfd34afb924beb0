package app

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpu-dra/gpu-dra/driver/cdi"
	"github.com/gpu-dra/gpu-dra/driver/faults"
	"github.com/gpu-dra/gpu-dra/driver/plugin"
	"github.com/gpu-dra/gpu-dra/driver/podresources"
	"github.com/gpu-dra/gpu-dra/internal/cliflag"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// Options are the plugin's settings; AddFlags gives each its flag.
type Options struct {
	DriverName string
	NodeName   string
	PodUID     string
	Kubeconfig string
	// NodeGroupsFile is the node-groups file; empty means the default devices on every node.
	NodeGroupsFile string
	RegistrarDir   string
	PluginsDir     string
	CDIRoot        string
	// HealthProbeBindAddress and MetricsBindAddress are where /healthz and /metrics are served;
	// cliflag.Disabled turns one off.
	HealthProbeBindAddress string
	MetricsBindAddress     string
	// PodResourcesSocket is the kubelet's PodResources API, which says which containers use which
	// devices (the allocation metrics' pod and container); empty leaves them out.
	PodResourcesSocket string
	// KubeAPIQPS and KubeAPIBurst limit the client. Every NodePrepareResources reads its claims
	// from the API server; client-go's default of 5 QPS would add 200ms to each prepare once the
	// burst is spent.
	KubeAPIQPS   float64
	KubeAPIBurst int
	// NodeGroupsPollInterval is how often the node-groups file is re-read (Node labels are watched).
	NodeGroupsPollInterval time.Duration
	// DeviceStatus records each prepared device's uuid, model, index and driverVersion in its
	// claim's status.devices (KEP-4817), where the API server keeps that field.
	DeviceStatus bool
	// DeviceMetadata has the kubeletplugin library write a device metadata file (KEP-5304) per
	// claim and request, bind-mounted into the containers through CDI.
	DeviceMetadata bool
	// FaultsConfigMap is the chart's faults ConfigMap as namespace/name: each node's simulated
	// faults are in the ConfigMap <name>-<node> (faults.ConfigMapSource, faults.ObjectName); empty
	// means no simulated faults.
	FaultsConfigMap string
	// NoExecuteFaultKinds are the fault kinds whose taint is NoExecute (others: NoSchedule).
	NoExecuteFaultKinds []string
	// DeleteAllSlices selects the chart's pre-delete hook instead of Run (see DeleteAllSlices).
	DeleteAllSlices bool
}

// NewOptions returns the defaults; node name and pod UID come from $NODE_NAME and $POD_UID
// (downward API).
func NewOptions() *Options {
	return &Options{
		DriverName:             deviceschema.DefaultDriverName,
		NodeName:               os.Getenv("NODE_NAME"),
		PodUID:                 os.Getenv("POD_UID"),
		RegistrarDir:           kubeletplugin.KubeletRegistryDir,
		PluginsDir:             kubeletplugin.KubeletPluginsDir,
		CDIRoot:                cdi.DefaultRoot,
		HealthProbeBindAddress: ":8081",
		MetricsBindAddress:     ":8080",
		PodResourcesSocket:     podresources.DefaultSocket,
		KubeAPIQPS:             50,
		KubeAPIBurst:           100,
		NodeGroupsPollInterval: 10 * time.Second,
		DeviceStatus:           true,
		DeviceMetadata:         true,
	}
}

// AddFlags registers the plugin's flags on fs, with the current values as defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.DriverName, "driver-name", o.DriverName, "DRA driver name; also the DeviceClass's driver and the attribute domain")
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "node this plugin runs on (default $NODE_NAME, from the downward API spec.nodeName)")
	fs.StringVar(&o.PodUID, "pod-uid", o.PodUID, "UID of this pod (default $POD_UID, from metadata.uid); enables rolling updates, empty disables them")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig file; empty means in-cluster config")
	fs.StringVar(&o.NodeGroupsFile, "node-groups", o.NodeGroupsFile, "node-groups file (YAML); empty means "+nodegroups.DefaultGroupDescription)
	fs.StringVar(&o.RegistrarDir, "kubelet-registrar-dir", o.RegistrarDir, "directory where the kubelet watches for plugin registration sockets")
	fs.StringVar(&o.PluginsDir, "kubelet-plugins-dir", o.PluginsDir, "parent of the plugin data directory (<dir>/<driver name>: DRA socket, checkpoint)")
	fs.StringVar(&o.CDIRoot, "cdi-root", o.CDIRoot, "directory for CDI spec files; the container runtime must read it")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", o.HealthProbeBindAddress, "address of the liveness probe endpoint /healthz (0 disables)")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "address of the Prometheus endpoint /metrics (0 disables)")
	fs.StringVar(&o.PodResourcesSocket, "pod-resources-socket", o.PodResourcesSocket, "the kubelet's PodResources API socket, read (at most every 10 s, when /metrics is scraped) to name the pod and container using each prepared device; empty leaves them out")
	fs.DurationVar(&o.NodeGroupsPollInterval, "node-groups-poll-interval", o.NodeGroupsPollInterval, "how often --node-groups is re-read; a change re-publishes the node's devices")
	fs.Float64Var(&o.KubeAPIQPS, "kube-api-qps", o.KubeAPIQPS, "queries per second to the API server (each prepare reads its claims)")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "burst of queries to the API server")
	fs.BoolVar(&o.DeviceStatus, "device-status", o.DeviceStatus, "record each prepared device's uuid, model, index and driverVersion in its ResourceClaim's status.devices (needs patch on resourceclaims/status)")
	fs.BoolVar(&o.DeviceMetadata, "device-metadata", o.DeviceMetadata, "bind-mount a device metadata file per claim and request into containers (/var/run/kubernetes.io/dra-device-attributes/...), through a CDI spec in --cdi-root")
	fs.StringVar(&o.FaultsConfigMap, "faults-configmap", o.FaultsConfigMap, "the chart's ConfigMap (namespace/name) of simulated device faults: this node's, written by `kubectl dra fault`, are in the ConfigMap <name>-<node name> (the one object the plugin watches); empty disables them; with --delete-all-slices, every node's is deleted too")
	cliflag.List(fs, "no-execute-fault-kinds", "comma-separated fault kinds ("+strings.Join(faults.UnhealthyKindNames(), ", ")+") whose device taint is NoExecute, evicting pods that do not tolerate it; other kinds taint NoSchedule", func(kinds []string) error {
		o.NoExecuteFaultKinds = kinds
		return nil
	})
	fs.BoolVar(&o.DeleteAllSlices, "delete-all-slices", o.DeleteAllSlices, "delete every node's ResourceSlices of --driver-name, and every node's faults ConfigMap of --faults-configmap, and exit (the chart's pre-delete hook)")
}

// Validate checks the options before anything starts and reports every problem at once, each
// naming its flag.
func (o *Options) Validate() error {
	errs := []error{deviceschema.ValidateDriverName("--driver-name", o.DriverName)}
	if o.NodeName == "" {
		errs = append(errs, errors.New("--node-name: required (default $NODE_NAME); set it from the downward API spec.nodeName"))
	}
	if o.RegistrarDir == "" {
		errs = append(errs, errors.New("--kubelet-registrar-dir: must not be empty, e.g. /var/lib/kubelet/plugins_registry"))
	}
	if o.PluginsDir == "" {
		errs = append(errs, errors.New("--kubelet-plugins-dir: must not be empty, e.g. /var/lib/kubelet/plugins"))
	}
	errs = append(errs,
		cliflag.ValidateBindAddress("--health-probe-bind-address", o.HealthProbeBindAddress),
		cliflag.ValidateBindAddress("--metrics-bind-address", o.MetricsBindAddress))
	for _, k := range o.NoExecuteFaultKinds {
		kind, err := faults.ParseKind(k)
		if err == nil && !kind.Unhealthy() {
			err = fmt.Errorf("fault kind %s never taints its device (it only fails attaches); remove it", kind)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("--no-execute-fault-kinds=%s: %w", strings.Join(o.NoExecuteFaultKinds, ","), err))
		}
	}
	if o.FaultsConfigMap != "" {
		ns, name := splitNamespaced(o.FaultsConfigMap)
		if len(validation.IsDNS1123Label(ns)) > 0 {
			errs = append(errs, fmt.Errorf("--faults-configmap=%q: want namespace/name, e.g. gpu-dra/gpu-dra-faults", o.FaultsConfigMap))
		} else if err := faults.ValidateBase(name); err != nil {
			errs = append(errs, fmt.Errorf("--faults-configmap=%q: name %w", o.FaultsConfigMap, err))
		}
	}
	return errors.Join(errs...)
}

// splitNamespaced splits namespace/name; without a slash the namespace is empty.
func splitNamespaced(s string) (string, string) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok {
		return "", s
	}
	return ns, name
}

// noExecuteKinds are the validated NoExecuteFaultKinds.
func (o *Options) noExecuteKinds() []faults.Kind {
	out := make([]faults.Kind, 0, len(o.NoExecuteFaultKinds))
	for _, k := range o.NoExecuteFaultKinds {
		out = append(out, faults.Kind(k))
	}
	return out
}

func (o *Options) clientset() (kubernetes.Interface, error) {
	return o.clientsetWithLimit(o.KubeAPIQPS, o.KubeAPIBurst)
}

// clientsetWithLimit is a client with a rate limiter of its own (connections are shared).
func (o *Options) clientsetWithLimit(qps float64, burst int) (kubernetes.Interface, error) {
	restConfig, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %q (empty means in-cluster): %w", o.Kubeconfig, err)
	}
	restConfig.QPS, restConfig.Burst = float32(qps), burst
	restConfig.UserAgent = "gpu-kubelet-plugin/" + o.NodeName
	clientset, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return clientset, nil
}

// DataDir is the plugin data directory: sockets, checkpoint, lock.
func (o *Options) DataDir() string { return filepath.Join(o.PluginsDir, o.DriverName) }

// RegistrationSocket is where the helper puts the registration socket.
func (o *Options) RegistrationSocket() string {
	if o.PodUID == "" {
		return filepath.Join(o.RegistrarDir, o.DriverName+"-reg.sock")
	}
	return filepath.Join(o.RegistrarDir, kubeletplugin.RollingUpdateRegistrarSocketFile(o.RegistrarDir, o.DriverName, types.UID(o.PodUID)))
}

// DRASocket is where the helper puts the DRA socket.
func (o *Options) DRASocket() string {
	return filepath.Join(o.DataDir(), plugin.DRASocketName(o.PodUID))
}
