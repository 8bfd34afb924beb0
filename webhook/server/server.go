package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpu-dra/gpu-dra/certs"
	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/internal/servedfeatures"
	"github.com/gpu-dra/gpu-dra/webhook/claimadmission"
	"github.com/gpu-dra/gpu-dra/webhook/podinject"
)

// NewManager creates the manager with the webhook server, probes and metrics configured from o.
// The webhook server watches CertDir and serves renewed certificates without a restart, and bounds
// every connection by o.Timeouts.
func NewManager(cfg *rest.Config, o *Options) (manager.Manager, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("build scheme: %w", err)
	}
	mgr, err := manager.New(cfg, manager.Options{
		Scheme:                 scheme,
		HealthProbeBindAddress: o.HealthProbeBindAddress,
		Metrics:                metricsserver.Options{BindAddress: o.MetricsBindAddress},
		WebhookServer: newWebhookServer(webhook.Options{
			Host:     o.Host,
			Port:     o.Port,
			CertDir:  o.CertDir,
			CertName: o.CertName,
			KeyName:  o.KeyName,
			TLSOpts:  certs.TLSOpts(),
		}, o.Timeouts),
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	return mgr, nil
}

// Setup registers the claim validation and the pod injection on mgr, plus the informers that
// feed the validator's view of the published devices and the probes that report them.
//
// RBAC the service account needs:
//   - resource.k8s.io resourceslices, deviceclasses: list, watch (every served version)
//   - "" nodes: list, watch
//   - resource.k8s.io resourceclaimtemplates: get, list, watch, create (managed templates of
//     annotated pods, watched to count them per namespace and check their specs; dry-run probes
//     of what the API server serves in o.Namespace)
//   - "" namespaces: get (the admin-access label)
//   - resource.k8s.io resourceclaims: list, watch (their allocations: what is free now)
func Setup(mgr manager.Manager, o *Options) error {
	groups, err := nodegroups.LoadConfig(o.NodeGroupsFile)
	if err != nil {
		return fmt.Errorf("--node-groups: %w", err)
	}
	cs, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return fmt.Errorf("create clientset: %w", err)
	}
	a := newAnalysis(cs, o, groups)
	if err := mgr.Add(manager.RunnableFunc(a.run)); err != nil {
		return fmt.Errorf("add informers: %w", err)
	}
	c := &cluster{informers: a.informers, features: a.features, cs: cs, shared: a.validator}
	templates := podinject.NewAPIClient(cs, podinject.WithMaxTemplatesPerNamespace(o.MaxTemplatesPerNamespace))
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		templates.Run(ctx)
		return nil
	})); err != nil {
		return fmt.Errorf("add managed template informer: %w", err)
	}
	injector, err := podinject.NewHandler(templates,
		podinject.WithDriverName(o.DriverName),
		podinject.WithMaxDevicesPerNode(groups.MaxDevicesPerNode()),
		podinject.WithValidator(a.validator),
		podinject.WithExcludedNamespaces(o.ExcludedNamespaces...),
		podinject.WithDeviceClasses(o.DeviceClasses...),
		podinject.WithCluster(c),
	)
	if err != nil {
		return fmt.Errorf("pod injection: %w", err)
	}
	templates.OnDelete(injector.Forget)
	srv := mgr.GetWebhookServer()
	srv.Register(ValidateClaimPath, &admission.Webhook{Handler: &claimadmission.Handler{Validator: a.validator}})
	srv.Register(claimadmission.AdminAccessPath, &admission.Webhook{Handler: &claimadmission.AdminAccessHandler{Support: c, Namespaces: c}})
	srv.Register(podinject.Path, injector)
	return addChecks(mgr, srv.StartedChecker(), a, templates)
}

// analysis is the claim validator and the caches it judges against: the published devices, the
// claims' allocations and what the API server serves.
type analysis struct {
	informers *inventory.Informers
	claims    *inventory.Claims
	features  *servedfeatures.Detector
	validator *claimvalidation.Validator
}

// newAnalysis makes the caches, then the validator that reads them. The caches' change callbacks
// reach the validator through a pointer set once it exists: a change before then has no view to
// invalidate.
func newAnalysis(cs kubernetes.Interface, o *Options, groups *nodegroups.Config) *analysis {
	// A device plugin's resource of the same name as a class's: kept of each Node, so that a pod
	// is never given GPUs twice.
	var advertised []corev1.ResourceName
	for _, c := range o.DeviceClasses {
		if c.ExtendedResourceName != "" {
			advertised = append(advertised, c.ExtendedResourceName)
		}
	}
	var validator atomic.Pointer[claimvalidation.Validator]
	a := &analysis{
		informers: inventory.NewInformers(cs, o.Resync, func() {
			if v := validator.Load(); v != nil {
				v.Invalidate()
			}
		}, advertised...),
		claims: inventory.NewClaims(cs, o.Resync, func() {
			if v := validator.Load(); v != nil {
				v.InvalidateClaims()
			}
		}),
		features: servedfeatures.New(cs, o.Namespace,
			servedfeatures.WithFallback(servedfeatures.PrioritizedList, "pods whose model annotation lists several models are denied with the fix"),
			servedfeatures.WithFallback(servedfeatures.AdminAccess, "claims asking for adminAccess are admitted with a warning that it is dropped"),
			servedfeatures.WithFallback(servedfeatures.ExtendedResource, "the pod webhook turns containers' limits of the DeviceClasses' extended resources into claims"),
			servedfeatures.WithFallback(servedfeatures.ConsumableCapacity, "claims are judged without capacity requests, and the memory annotation stays a least-memory selector"),
			servedfeatures.WithFallback(servedfeatures.PartitionableDevices, "claims are judged without counters")),
	}
	a.validator = claimvalidation.New(o.DriverName, groups, o.Deny, a.informers, claimvalidation.WithServed(a.features), claimvalidation.WithClaims(a.claims))
	validator.Store(a.validator)
	return a
}

// run starts the caches and learns what the API server serves, then waits for ctx to end.
func (a *analysis) run(ctx context.Context) error {
	a.informers.Start(ctx)
	a.claims.Start(ctx)
	// Find out what the API server serves now rather than at the first request that needs it,
	// and say so in the log once.
	a.features.Warm(ctx)
	if cache.WaitForCacheSync(ctx.Done(), a.informers.HasSynced) {
		a.features.ExtendedResources(ctx, a.informers.DeviceClasses())
	}
	if cache.WaitForCacheSync(ctx.Done(), a.informers.HasSynced, a.claims.HasSynced) {
		// The initial lists are the process's peak (pages decoded next to what the caches
		// keep): hand that back to the OS now rather than when the scavenger gets to it,
		// so that the footprint a node sees is what the caches hold.
		debug.FreeOSMemory()
	}
	<-ctx.Done()
	return nil
}

// addChecks adds the liveness check and the readiness checks: the webhook server started, and
// every cache listed.
func addChecks(mgr manager.Manager, started healthz.Checker, a *analysis, templates *podinject.APIClient) error {
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("add healthz: %w", err)
	}
	if err := mgr.AddReadyzCheck("webhook", started); err != nil {
		return fmt.Errorf("add readyz: %w", err)
	}
	if err := mgr.AddReadyzCheck("inventory", func(*http.Request) error {
		if !a.informers.HasSynced() {
			return errors.New("ResourceSlice, DeviceClass and Node caches not synced yet")
		}
		if !a.claims.HasSynced() {
			return errors.New("ResourceClaims not listed yet")
		}
		if !templates.HasSynced() {
			return errors.New("managed ResourceClaimTemplates not listed yet")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("add readyz: %w", err)
	}
	return nil
}
