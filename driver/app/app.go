// Package app wires the kubelet plugin together: API client, inventory, reconciliation, the
// kubeletplugin helper, publishing, HTTP endpoints and the shutdown rule. cmd/gpu-kubelet-plugin
// only fills Options from flags and calls Run.
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/gpu-dra/gpu-dra/driver/cdi"
	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
	"github.com/gpu-dra/gpu-dra/driver/liveness"
	"github.com/gpu-dra/gpu-dra/driver/metrics"
	"github.com/gpu-dra/gpu-dra/driver/plugin"
	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// Options are the plugin's settings; each has a flag of the same name in cmd/gpu-kubelet-plugin.
type Options struct {
	DriverName      string
	NodeName        string
	PodUID          string
	Kubeconfig      string
	InventoryConfig string
	RegistrarDir    string
	PluginsDir      string
	CDIRoot         string
	HealthAddr      string
	MetricsAddr     string
	// ShutdownTimeout bounds the slice cleanup after SIGTERM.
	ShutdownTimeout time.Duration
	// KubeAPIQPS and KubeAPIBurst limit the client. Every NodePrepareResources reads its claims
	// from the API server; client-go's default of 5 QPS would add 200ms to each prepare once the
	// burst is spent.
	KubeAPIQPS   float32
	KubeAPIBurst int
	// InventoryPollInterval is how often the inventory file is re-read (Node labels are watched).
	InventoryPollInterval time.Duration
}

// Validate names the flag to fix.
func (o *Options) Validate() error {
	var errs []error
	if msgs := validation.IsDNS1123Subdomain(o.DriverName); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--driver-name %q: %v", o.DriverName, msgs))
	}
	if o.NodeName == "" {
		errs = append(errs, errors.New("--node-name (or env NODE_NAME) is required; set it from the downward API spec.nodeName"))
	}
	if o.RegistrarDir == "" || o.PluginsDir == "" {
		errs = append(errs, errors.New("--kubelet-registrar-dir and --kubelet-plugins-dir must not be empty"))
	}
	return errors.Join(errs...)
}

func (o *Options) clientset() (kubernetes.Interface, error) {
	restConfig, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %q (empty means in-cluster): %w", o.Kubeconfig, err)
	}
	restConfig.QPS, restConfig.Burst = o.KubeAPIQPS, o.KubeAPIBurst
	restConfig.UserAgent = "gpu-kubelet-plugin/" + o.NodeName
	clientset, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return clientset, nil
}

// DeleteAllSlices deletes every node's ResourceSlices of the driver and returns: the chart's
// pre-delete hook, so an uninstall leaves none behind even for nodes whose plugin is already gone.
func DeleteAllSlices(ctx context.Context, o Options) error {
	clientset, err := o.clientset()
	if err != nil {
		return err
	}
	n, err := plugin.DeleteSlices(ctx, draclient.New(clientset), o.DriverName, "")
	if err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Deleted ResourceSlices", "driver", o.DriverName, "count", n)
	return nil
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

// Run serves until ctx is canceled (SIGTERM), then shuts down and, unless a rolling-update
// successor is serving, deletes the node's ResourceSlices.
func Run(ctx context.Context, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	logger := klog.FromContext(ctx).WithValues("driver", o.DriverName, "node", o.NodeName)
	ctx = klog.NewContext(ctx, logger)

	clientset, err := o.clientset()
	if err != nil {
		return err
	}
	// The library's client (used by the helper and the ResourceSlice controller) has no discovery
	// of its own: it starts with v1 and moves on when a call gets a 404. That finds the same
	// version, but a cluster without DRA would only show as endless 404 retries in the background;
	// checking up front fails with a message that says what to enable.
	version, err := resourceversion.Newest(clientset.Discovery())
	if err != nil {
		return err
	}
	logger.Info("API server serves resource.k8s.io", "version", version)

	node, err := getNode(ctx, clientset, o.NodeName)
	if err != nil {
		return err
	}
	if o.PodUID != "" && !kubeletSupportsRollingUpdate(node) {
		// A 1.32 kubelet knows one registration socket per driver; a second, differently named one
		// would replace the first. Fall back to the fixed socket names.
		logger.Info("Kubelet predates rolling-update support (1.33); running without RollingUpdate", "kubeletVersion", node.Status.NodeInfo.KubeletVersion)
		o.PodUID = ""
	}
	invConfig, err := nodegroups.LoadConfig(o.InventoryConfig)
	if err != nil {
		return fmt.Errorf("--inventory-config: %w", err)
	}
	spec := invConfig.ForNode(node.Labels)
	logger.Info("Inventory", "count", spec.Count, "model", spec.Model, "memory", spec.Memory.String())
	source := simulated.New(o.NodeName, spec)

	if err := os.MkdirAll(o.DataDir(), 0o750); err != nil {
		return fmt.Errorf("plugin data directory: %w", err)
	}
	writer, err := cdi.NewWriter(o.CDIRoot, o.DriverName)
	if err != nil {
		return fmt.Errorf("--cdi-root: %w", err)
	}
	m := metrics.New()
	signalCtx := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	driver, err := plugin.NewDriver(ctx, o.DriverName, o.NodeName, source, writer, checkpoint.NewStore(o.DataDir()),
		plugin.WithMetrics(m), plugin.WithFatalHandler(func(err error) { cancel(err) }))
	if err != nil {
		return err
	}
	resourceClient := draclient.New(clientset)
	if _, err := driver.Reconcile(ctx, resourceClient); err != nil {
		return fmt.Errorf("reconcile prepared claims: %w", err)
	}

	stopMetrics, err := serve(ctx, "metrics", o.MetricsAddr, func(mux *http.ServeMux) { mux.Handle("/metrics", m.Handler()) })
	if err != nil {
		return err
	}
	defer stopMetrics()

	helperOpts := []kubeletplugin.Option{
		kubeletplugin.DriverName(o.DriverName),
		kubeletplugin.NodeName(o.NodeName),
		kubeletplugin.NodeUID(node.UID),
		kubeletplugin.KubeClient(clientset),
		kubeletplugin.RegistrarDirectoryPath(o.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(o.DataDir()),
		kubeletplugin.HealthService(false),
	}
	if o.PodUID != "" {
		helperOpts = append(helperOpts, kubeletplugin.RollingUpdate(types.UID(o.PodUID)))
	}
	helper, err := kubeletplugin.Start(ctx, driver, helperOpts...)
	if err != nil {
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	resources, err := plugin.Resources(ctx, o.NodeName, source)
	if err != nil {
		helper.Stop()
		return err
	}
	if err := helper.PublishResources(ctx, resources); err != nil {
		helper.Stop()
		return fmt.Errorf("publish ResourceSlices: %w", err)
	}

	watcher := &plugin.NodeGroupWatcher{
		NodeName: o.NodeName, ConfigPath: o.InventoryConfig, Interval: o.InventoryPollInterval,
		Client: clientset, Driver: driver, Publisher: helper, Current: spec,
	}
	watchDone := make(chan struct{})
	watchCtx, stopWatch := context.WithCancel(ctx)
	go func() { defer close(watchDone); watcher.Run(watchCtx) }()
	defer func() { stopWatch(); <-watchDone }()

	checker := &liveness.Checker{DriverName: o.DriverName, RegistrationSocket: o.RegistrationSocket(), DRASocket: o.DRASocket()}
	stopHealth, err := serve(ctx, "health", o.HealthAddr, func(mux *http.ServeMux) {
		h := http.StripPrefix("/healthz", &healthz.Handler{Checks: map[string]healthz.Checker{"sockets": checker.Healthz}})
		mux.Handle("/healthz", h)
		mux.Handle("/healthz/", h)
	})
	if err != nil {
		helper.Stop()
		return err
	}
	defer stopHealth()
	logger.Info("Kubelet plugin running", "registrationSocket", o.RegistrationSocket(), "draSocket", o.DRASocket(), "rollingUpdate", o.PodUID != "")

	<-ctx.Done()
	cause := context.Cause(ctx)
	logger.Info("Shutting down", "cause", cause)
	stopWatch()
	<-watchDone
	helper.Stop()
	if signalCtx.Err() == nil {
		// A fatal error, not SIGTERM: the pod restarts and republishes the same slices, so deleting
		// them would only make the scheduler see the node's GPUs flicker.
		return cause
	}
	shutdown(o, resourceClient, logger)
	return nil
}

// shutdown runs after the helper stopped (its sockets are gone, the slice controller no longer
// writes). It uses a fresh context: the main one is already canceled.
func shutdown(o Options, slices plugin.SliceClient, logger klog.Logger) {
	timeout := o.ShutdownTimeout
	if timeout == 0 {
		timeout = 20 * time.Second
	}
	ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), logger), timeout)
	defer cancel()
	if o.PodUID != "" {
		if socket, ok := plugin.SuccessorRunning(ctx, o.DataDir(), plugin.DRASocketName(o.PodUID)); ok {
			logger.Info("Rolling-update successor is serving; leaving ResourceSlices to it", "successorSocket", socket)
			return
		}
	}
	n, err := plugin.DeleteSlices(ctx, slices, o.DriverName, o.NodeName)
	if err != nil {
		logger.Error(err, "Deleting this node's ResourceSlices failed; the chart's pre-delete hook removes leftovers")
		return
	}
	logger.Info("Deleted this node's ResourceSlices", "count", n)
}

// kubeletSupportsRollingUpdate: two plugin instances side by side need kubelet 1.33+. An unknown
// version (no status yet) is assumed to be new.
func kubeletSupportsRollingUpdate(node *corev1.Node) bool {
	v, err := version.ParseGeneric(node.Status.NodeInfo.KubeletVersion)
	if err != nil {
		return true
	}
	return v.AtLeast(version.MajorMinor(1, 33))
}

// getNode reads the plugin's Node, retrying briefly: right after a node joins, the plugin can start
// before its Node object is visible.
func getNode(ctx context.Context, cs kubernetes.Interface, name string) (*corev1.Node, error) {
	var node *corev1.Node
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		node, lastErr = cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		return lastErr == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("get Node %q (needs RBAC get on nodes): %w", name, errors.Join(lastErr, err))
	}
	return node, nil
}

// serve starts an HTTP server on addr; an empty addr disables it.
func serve(ctx context.Context, name, addr string, register func(*http.ServeMux)) (func(), error) {
	if addr == "" {
		return func() {}, nil
	}
	mux := http.NewServeMux()
	register(mux)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s server on %s: %w", name, addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "HTTP server failed", "server", name)
		}
	}()
	klog.FromContext(ctx).Info("Serving", "server", name, "addr", ln.Addr().String())
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}, nil
}
