// Package app wires the kubelet plugin together: API client, node groups, reconciliation, the
// kubeletplugin helper, publishing, HTTP endpoints and the shutdown rule. Options and their flags
// live here too; cmd/gpu-kubelet-plugin only registers the flags, parses them and calls Run.
package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/gpu-dra/gpu-dra/driver/attach"
	"github.com/gpu-dra/gpu-dra/driver/cdi"
	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
	"github.com/gpu-dra/gpu-dra/driver/devicestatus"
	"github.com/gpu-dra/gpu-dra/driver/faults"
	"github.com/gpu-dra/gpu-dra/driver/liveness"
	"github.com/gpu-dra/gpu-dra/driver/metrics"
	"github.com/gpu-dra/gpu-dra/driver/plugin"
	"github.com/gpu-dra/gpu-dra/driver/podresources"
	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/cliflag"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// DeleteAllSlices deletes every node's ResourceSlices of the driver, and with FaultsConfigMap
// every node's faults ConfigMap, and returns: the chart's pre-delete hook, so an uninstall leaves
// none behind even for nodes whose plugin is already gone.
func DeleteAllSlices(ctx context.Context, o Options) error {
	clientset, err := o.clientset()
	if err != nil {
		return err
	}
	n, err := plugin.DeleteSlices(ctx, draclient.New(clientset), o.DriverName)
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	logger.Info("Deleted ResourceSlices", "driver", o.DriverName, "count", n)
	if o.FaultsConfigMap == "" {
		return nil
	}
	ns, name := splitNamespaced(o.FaultsConfigMap)
	if err := faults.DeleteAll(ctx, clientset, ns, name); err != nil {
		return err
	}
	logger.Info("Deleted the nodes' faults ConfigMaps", "namespace", ns, "selector", faults.Selector(name))
	return nil
}

// Run serves until ctx is canceled (SIGTERM) or something fatal happens, then shuts down. The
// node's ResourceSlices stay, as the helper's Stop leaves them: a plugin that goes away is
// nearly always coming back (liveness kill, deleted or evicted pod, DaemonSet update) and
// publishes the same devices again; deleting them would take the node's GPUs away from the
// scheduler until then. A plugin gone for good leaves them to the kubelet, which deletes a
// driver's slices once no plugin of it is registered (30 s later since Kubernetes 1.33, at once on
// 1.32), and `helm uninstall` leaves them to the chart's pre-delete hook (DeleteAllSlices).
func Run(ctx context.Context, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	logger := klog.FromContext(ctx).WithValues("driver", o.DriverName, "node", o.NodeName)
	ctx = klog.NewContext(ctx, logger)
	signalCtx := ctx
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)

	p := &instance{o: o}
	defer p.stop()
	if err := p.start(ctx, fail); err != nil {
		return err
	}
	logger.Info("Kubelet plugin running", "registrationSocket", p.o.RegistrationSocket(), "draSocket", p.o.DRASocket(), "rollingUpdate", p.o.PodUID != "")

	<-ctx.Done()
	cause := context.Cause(ctx)
	logger.Info("Shutting down", "cause", cause)
	if signalCtx.Err() == nil {
		// A fatal error, not SIGTERM: exit with it, so that the container is restarted.
		return cause
	}
	return nil
}

// instance is this plugin process: what start got running, so that stop can end exactly that.
type instance struct {
	o      Options
	client kubernetes.Interface
	// resourceClient reads claims in whichever resource.k8s.io version the server serves.
	resourceClient *draclient.Client
	// resourceVersion is the newest resource.k8s.io version the server serves.
	resourceVersion string
	driver          *plugin.Driver
	metrics         *metrics.Metrics
	// sharing decides whether node groups may publish shared GPUs, asked again periodically.
	sharing *plugin.SharingGate

	stopStatus  func()
	stopMetrics func()
	helper      *kubeletplugin.Helper
	stopWatcher func()
	stopHealth  func()

	// published is the node group's spec as published now (after the sharing gate).
	published  atomic.Pointer[nodegroups.GroupSpec]
	stopAttach func()

	// health tracks the node's device faults; publisher adds their taints to what is published.
	health     *faults.Tracker
	publisher  *plugin.TaintingPublisher
	stopFaults func()
}

// start brings the plugin up step by step; whatever started before a failing step is left to
// stop. fail ends Run with an error that retrying will not fix.
func (p *instance) start(ctx context.Context, fail context.CancelCauseFunc) error {
	logger := klog.FromContext(ctx)
	node, err := p.connect(ctx)
	if err != nil {
		return err
	}
	groups, err := nodegroups.LoadConfig(p.o.NodeGroupsFile)
	if err != nil {
		return fmt.Errorf("--node-groups: %w", err)
	}
	group, spec := groups.GroupFor(node.Labels)
	logger.Info("Inventory", "count", spec.Count, "model", spec.Model, "memory", spec.Memory.String())
	p.sharing = &plugin.SharingGate{
		ConsumableCapacity: func(ctx context.Context) (string, error) {
			return plugin.ProbeConsumableCapacity(ctx, p.resourceClient.ResourceSlices(), p.o.DriverName, p.o.NodeName)
		},
		Partitionable: func(ctx context.Context) (plugin.CounterLayout, string, error) {
			return plugin.ProbePartitionable(ctx, p.resourceClient.ResourceSlices(), p.o.DriverName, p.o.NodeName)
		},
		BindingConditions: func(ctx context.Context) (string, error) {
			return plugin.ProbeBindingConditions(ctx, p.resourceClient.ResourceSlices(), p.o.DriverName, p.o.NodeName)
		},
	}
	published := p.sharing.Effective(ctx, group, spec)
	p.published.Store(&published)
	source := simulated.New(p.o.NodeName, published)
	p.newHealth()
	if err := p.newDriver(ctx, source, fail); err != nil {
		return err
	}

	if p.stopMetrics, err = serve(ctx, "metrics", p.o.MetricsBindAddress, func(mux *http.ServeMux) { mux.Handle("/metrics", p.metrics.Handler()) }); err != nil {
		return err
	}
	if err := p.startHelper(ctx, node, source); err != nil {
		return err
	}
	p.startHealth(ctx)
	p.startWatcher(ctx, spec)
	p.startAttacher(ctx)

	checker := &liveness.Checker{DriverName: p.o.DriverName, RegistrationSocket: p.o.RegistrationSocket(), DRASocket: p.o.DRASocket()}
	p.stopHealth, err = serve(ctx, "health", p.o.HealthProbeBindAddress, func(mux *http.ServeMux) {
		h := http.StripPrefix("/healthz", &healthz.Handler{Checks: map[string]healthz.Checker{"sockets": checker.Healthz}})
		mux.Handle("/healthz", h)
		mux.Handle("/healthz/", h)
	})
	return err
}

// connect makes the API client and reads this node; it turns rolling updates off where the
// kubelet cannot do them.
func (p *instance) connect(ctx context.Context) (*corev1.Node, error) {
	logger := klog.FromContext(ctx)
	clientset, err := p.o.clientset()
	if err != nil {
		return nil, err
	}
	p.client = clientset
	p.resourceClient = draclient.New(clientset)
	// The library's client (used by the helper and the ResourceSlice controller) has no discovery
	// of its own: it starts with v1 and moves on when a call gets a 404. That finds the same
	// version, but a cluster without DRA would only show as endless 404 retries in the background;
	// checking up front fails with a message that says what to enable.
	version, err := resourceversion.Newest(clientset.Discovery())
	if err != nil {
		return nil, err
	}
	p.resourceVersion = version
	logger.Info("API server serves resource.k8s.io", "version", version)

	node, err := getNode(ctx, clientset, p.o.NodeName)
	if err != nil {
		return nil, err
	}
	if p.o.PodUID != "" && !kubeletSupportsRollingUpdate(node) {
		// A 1.32 kubelet knows one registration socket per driver; a second, differently named one
		// would replace the first. Fall back to the fixed socket names.
		logger.Info("Kubelet predates rolling-update support (1.33); running without RollingUpdate", "kubeletVersion", node.Status.NodeInfo.KubeletVersion)
		p.o.PodUID = ""
	}
	return node, nil
}

// newDriver makes the DRAPlugin and reconciles what an earlier instance left prepared.
func (p *instance) newDriver(ctx context.Context, source plugin.DeviceSource, fail context.CancelCauseFunc) error {
	if err := os.MkdirAll(p.o.DataDir(), 0o750); err != nil {
		return fmt.Errorf("plugin data directory: %w", err)
	}
	writer, err := cdi.NewWriter(p.o.CDIRoot, p.o.DriverName)
	if err != nil {
		return fmt.Errorf("--cdi-root: %w", err)
	}
	var mopts []metrics.Option
	if p.o.PodResourcesSocket != "" {
		pr, err := podresources.New(p.o.DriverName, p.o.PodResourcesSocket)
		if err != nil {
			return fmt.Errorf("--pod-resources-socket: %w", err)
		}
		mopts = append(mopts, metrics.WithConsumers(pr))
	}
	p.metrics = metrics.New(mopts...)
	opts := []plugin.DriverOption{plugin.WithMetrics(p.metrics), plugin.WithFatalHandler(fail), plugin.WithHealth(p.health)}
	if p.o.DeviceStatus {
		status, err := p.statusWriter()
		if err != nil {
			return err
		}
		p.stopStatus = status.Start(ctx)
		opts = append(opts, plugin.WithStatusRecorder(status))
	}
	p.driver, err = plugin.NewDriver(ctx, p.o.DriverName, p.o.NodeName, source, writer, checkpoint.NewStore(p.o.DataDir()), opts...)
	if err != nil {
		return err
	}
	if _, err := p.driver.Reconcile(ctx, p.resourceClient); err != nil {
		return fmt.Errorf("reconcile prepared claims: %w", err)
	}
	// Whether or not metadata is on now, an earlier instance may have left some behind.
	if _, err := p.driver.RemoveStaleMetadata(ctx, plugin.MetadataLocation{DataDir: p.o.DataDir(), CDIDir: cmp.Or(p.o.CDIRoot, cdi.DefaultRoot)}); err != nil {
		klog.FromContext(ctx).Error(err, "Removing stale device metadata failed; retried at the next start")
	}
	return p.driver.ResyncStatus(ctx)
}

// Status writes have a client and rate limit of their own, so a burst of them never makes a
// prepare's claim read wait for the shared client's tokens.
const (
	statusQPS   = 10
	statusBurst = 20
)

// statusWriter records claim device status through the newest served resource.k8s.io version.
func (p *instance) statusWriter() (*devicestatus.Writer, error) {
	cs, err := p.o.clientsetWithLimit(statusQPS, statusBurst)
	if err != nil {
		return nil, err
	}
	return devicestatus.New(cs, p.o.DriverName, p.resourceVersion, devicestatus.WithMetrics(p.metrics))
}

// startHelper registers with the kubelet and publishes the node's devices.
func (p *instance) startHelper(ctx context.Context, node *corev1.Node, source plugin.DeviceSource) error {
	helperOpts := []kubeletplugin.Option{
		kubeletplugin.DriverName(p.o.DriverName),
		kubeletplugin.NodeName(p.o.NodeName),
		kubeletplugin.NodeUID(node.UID),
		kubeletplugin.KubeClient(p.client),
		kubeletplugin.RegistrarDirectoryPath(p.o.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(p.o.DataDir()),
		// Device health for the kubelet (KEP-4680): kubelets without ResourceHealthStatus never
		// subscribe, and 1.32's registration ignores services it does not know.
		kubeletplugin.HealthService(true),
	}
	if p.o.DeviceMetadata {
		helperOpts = append(helperOpts, deviceMetadataOptions(p.o.CDIRoot)...)
	}
	if p.o.PodUID != "" {
		helperOpts = append(helperOpts, kubeletplugin.RollingUpdate(types.UID(p.o.PodUID)))
	}
	helper, err := kubeletplugin.Start(ctx, p.driver, helperOpts...)
	if err != nil {
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	p.helper = helper
	p.publisher.Publisher = helper
	resources, err := plugin.Resources(ctx, p.o.NodeName, source, p.sharing.Layout())
	if err != nil {
		return err
	}
	if err := p.publisher.PublishResources(ctx, resources); err != nil {
		return fmt.Errorf("publish ResourceSlices: %w", err)
	}
	return nil
}

// startWatcher re-publishes when the node's group changes; published is what is published now.
func (p *instance) startWatcher(ctx context.Context, published nodegroups.GroupSpec) {
	watcher := &plugin.NodeGroupWatcher{
		NodeName: p.o.NodeName, ConfigPath: p.o.NodeGroupsFile, Interval: p.o.NodeGroupsPollInterval,
		Client: p.client, Driver: p.driver, Publisher: p.publisher, Current: published, Sharing: p.sharing,
		// What the API server serves is asked again under the running plugin: a control-plane
		// upgrade turns sharing, partitions and device taints on without a plugin restart.
		Taints:    p.publisher,
		Published: func(spec nodegroups.GroupSpec) { p.published.Store(&spec); p.startAttacher(ctx) },
	}
	watchCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); watcher.Run(watchCtx) }()
	p.stopWatcher = func() { cancel(); <-done }
}

// startAttacher attaches the devices of an attachable node group as the scheduler allocates them
// (binding conditions), from the first time the node publishes them on: its claim informer is not
// paid for by nodes that never do. It keeps running if the node's group changes (devices allocated
// before still need their attach). Called from start and from the watcher's goroutine only.
func (p *instance) startAttacher(ctx context.Context) {
	if p.stopAttach != nil || p.published.Load().ModeOf() != nodegroups.Attachable {
		return
	}
	a := attach.New(p.client, p.o.DriverName, p.o.NodeName,
		attach.WithDelay(func() time.Duration { return p.published.Load().Sharing.AttachDelayOf() }),
		attach.WithFaults(p.health.Faults))
	attachCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); a.Run(attachCtx) }()
	p.stopAttach = func() { cancel(); <-done }
}

// stop ends whatever start got running, in one order: first what changes the published devices
// (the watcher, the faults, then the helper: its sockets go and its slice controller stops writing; the slices
// stay), the HTTP endpoints last, so probes and metrics answer throughout.
func (p *instance) stop() {
	if p.stopWatcher != nil {
		p.stopWatcher()
	}
	if p.stopAttach != nil {
		p.stopAttach()
	}
	if p.stopFaults != nil {
		p.stopFaults()
	}
	if p.helper != nil {
		p.helper.Stop()
	}
	if p.stopStatus != nil {
		p.stopStatus()
	}
	if p.stopHealth != nil {
		p.stopHealth()
	}
	if p.stopMetrics != nil {
		p.stopMetrics()
	}
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

// serve starts an HTTP server on addr; cliflag.Disabled turns it off.
func serve(ctx context.Context, name, addr string, register func(*http.ServeMux)) (func(), error) {
	if addr == cliflag.Disabled {
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
