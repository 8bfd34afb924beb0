package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation"
	"github.com/gpu-dra/gpu-dra/internal/analysis/diagnosis"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/internal/servedfeatures"
	"github.com/gpu-dra/gpu-dra/webhook/claimadmission"
	"github.com/gpu-dra/gpu-dra/webhook/fleetmetrics"
	"github.com/gpu-dra/gpu-dra/webhook/podinject"
)

// Setup registers the claim validation and the pod injection on r, plus the informers that
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
func Setup(r *Runner, o *Options) error {
	groups, err := nodegroups.LoadConfig(o.NodeGroupsFile)
	if err != nil {
		return fmt.Errorf("--node-groups: %w", err)
	}
	cs, err := kubernetes.NewForConfig(r.GetConfig())
	if err != nil {
		return fmt.Errorf("create clientset: %w", err)
	}
	h, err := newHandlers(cs, o, groups)
	if err != nil {
		return err
	}
	r.Add(RunnableFunc(func(ctx context.Context) error {
		h.run(ctx)
		return nil
	}))
	r.Add(RunnableFunc(func(ctx context.Context) error {
		h.templates.Run(ctx)
		return nil
	}))
	if err := register(h.fleet); err != nil {
		return fmt.Errorf("register fleet metrics: %w", err)
	}
	srv := r.GetWebhookServer()
	for path, handler := range h.routes() {
		srv.Register(path, handler)
	}

	if err := r.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("add healthz: %w", err)
	}
	if err := r.AddReadyzCheck("webhook", srv.StartedChecker()); err != nil {
		return fmt.Errorf("add readyz: %w", err)
	}
	if err := r.AddReadyzCheck("inventory", func(*http.Request) error {
		if !h.informers.HasSynced() {
			return errors.New("ResourceSlice, DeviceClass and Node caches not synced yet")
		}
		if !h.claims.HasSynced() {
			return errors.New("ResourceClaims not listed yet")
		}
		if !h.templates.HasSynced() {
			return errors.New("managed ResourceClaimTemplates not listed yet")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("add readyz: %w", err)
	}
	return nil
}

// settleTimeout bounds the wait for the first index of the listed state (Validator.Settle).
const settleTimeout = 30 * time.Second

// featureRefresh is how often the webhook asks the API server again what it serves.
const featureRefresh = 30 * time.Second

// handlers are the admission handlers and the informers and probes that feed them.
type handlers struct {
	informers *inventory.Informers
	claims    *inventory.Claims
	features  *servedfeatures.Detector
	restorer  *classRestorer
	templates *podinject.APIClient
	validator *claimvalidation.Validator
	injector  *podinject.Handler
	cluster   *cluster
	// fleet is summed at each rebuild of the validator's index of current allocations.
	fleet *fleetmetrics.Collector
}

// newHandlers wires the handlers to cs as the webhook serves them; nothing runs until run and
// templates.Run are called.
func newHandlers(cs kubernetes.Interface, o *Options, groups *nodegroups.Config) (*handlers, error) {
	// A device plugin's resource of the same name as a class's: kept of each Node, so that a pod
	// is never given GPUs twice.
	var advertised []corev1.ResourceName
	for _, c := range o.DeviceClasses {
		if c.ExtendedResourceName != "" {
			advertised = append(advertised, c.ExtendedResourceName)
		}
	}
	// The caches' change callbacks read h.validator when they run; nothing runs before run is
	// called, by when it is set.
	h := &handlers{}
	h.informers = inventory.NewInformers(cs, o.Resync, func() { h.validator.Invalidate() }, advertised...)
	h.claims = inventory.NewClaims(cs, o.Resync, func() { h.validator.InvalidateClaims() })
	h.restorer = &classRestorer{classes: o.DeviceClasses, stored: h.informers.DeviceClasses, patch: cs.ResourceV1().DeviceClasses()}
	h.features = servedfeatures.New(cs, o.Namespace,
		servedfeatures.WithFallback(servedfeatures.PrioritizedList, "pods whose model annotation lists several models are denied with the fix"),
		servedfeatures.WithFallback(servedfeatures.AdminAccess, "claims asking for adminAccess are admitted with a warning that it is dropped"),
		servedfeatures.WithFallback(servedfeatures.ExtendedResource, "the pod webhook turns containers' limits of the DeviceClasses' extended resources into claims"),
		servedfeatures.WithFallback(servedfeatures.ConsumableCapacity, "claims are judged without capacity requests, and the memory annotation stays a least-memory selector"),
		servedfeatures.WithFallback(servedfeatures.PartitionableDevices, "claims are judged without counters"),
		servedfeatures.WithStoredClasses(h.restorer.list))
	h.fleet = fleetmetrics.New(o.DriverName, fleetmetrics.WithRefresh(func() { h.validator.InvalidateClaims() }))
	h.validator = claimvalidation.New(o.DriverName, groups, o.Deny, h.informers, claimvalidation.WithServed(h.features),
		claimvalidation.WithClaims(h.claims, diagnosis.WithRebuildObserver(h.fleet.Observe)))
	h.cluster = &cluster{informers: h.informers, classes: h.restorer.list, features: h.features, cs: cs, shared: h.validator}
	h.templates = podinject.NewAPIClient(cs, podinject.WithMaxTemplatesPerNamespace(o.MaxTemplatesPerNamespace))
	injector, err := podinject.NewHandler(h.templates,
		podinject.WithDriverName(o.DriverName),
		podinject.WithMaxDevicesPerNode(groups.MaxDevicesPerNode()),
		podinject.WithValidator(h.validator),
		podinject.WithExcludedNamespaces(o.ExcludedNamespaces...),
		podinject.WithDeviceClasses(o.DeviceClasses...),
		podinject.WithCluster(h.cluster),
		podinject.WithPodGroups(podinject.NewPodGroupClient(cs.Discovery())),
	)
	if err != nil {
		return nil, fmt.Errorf("pod injection: %w", err)
	}
	h.injector = injector
	h.templates.OnDelete(injector.Forget)
	return h, nil
}

// run starts the inventory informers and the feature probes, and returns when ctx ends.
func (h *handlers) run(ctx context.Context) {
	collectOftenWhile(func() { h.start(ctx) })
	<-ctx.Done()
}

// start starts the informers and the probes and returns once the initial lists are in and
// indexed (or ctx ended).
func (h *handlers) start(ctx context.Context) {
	h.informers.Start(ctx)
	h.claims.Start(ctx)
	// Find out what the API server serves now rather than at the first request that needs it,
	// and say so in the log once.
	h.features.Warm(ctx)
	if cache.WaitForCacheSync(ctx.Done(), h.informers.HasSynced) {
		h.restorer.restore(ctx)
		h.features.ExtendedResources(ctx, h.restorer.list())
	}
	// A control-plane upgrade turns features on under the running webhook: ask again
	// periodically, not only when a cached answer expires at a request.
	go wait.JitterUntilWithContext(ctx, h.refresh, featureRefresh, servedfeatures.RefreshJitter, false)
	if cache.WaitForCacheSync(ctx.Done(), h.informers.HasSynced, h.claims.HasSynced) {
		// The initial lists are the process's peak (pages decoded next to what the caches
		// keep, and the indexes rebuilt while the lists came in): once the index of what
		// they hold is built, hand that back to the OS rather than when the scavenger gets
		// to it, so that the footprint a node sees is what the caches and the index hold.
		settle, cancel := context.WithTimeout(ctx, settleTimeout)
		h.validator.Settle(settle)
		cancel()
		debug.FreeOSMemory()
	}
}

// startGCPercent is the collector's target (GOGC) while the initial lists come in: every page
// decoded is garbage next to the little the caches keep of it, and at the usual target the
// pages pile up to twice what is kept before a collection, leaving what is kept spread over
// twice the spans. At 5,000 nodes it lowered the start's peak by 7.5 MiB and the footprint after
// it by 0.8 MiB (docs/performance.md), for collections of a heap of a few megabytes.
const startGCPercent = 25

// collectOftenWhile runs f with the collector's target at startGCPercent, unless GOGC set it
// lower or off, and then puts back what GOGC set.
func collectOftenWhile(f func()) {
	prev := debug.SetGCPercent(startGCPercent)
	defer debug.SetGCPercent(prev)
	if prev < startGCPercent { // lower already, or off (-1)
		debug.SetGCPercent(prev)
	}
	f()
}

// refresh asks the API server again what it serves. The chart's classes get back the
// extendedResourceName an older release dropped as soon as the API server keeps it, and the
// feature is read from them as restored, in the same round.
func (h *handlers) refresh(ctx context.Context) {
	if h.informers.HasSynced() {
		h.restorer.restore(ctx)
	}
	h.features.Refresh(ctx)
}

// routes are the handlers by the path the webhook serves each at.
func (h *handlers) routes() map[string]http.Handler {
	return map[string]http.Handler{
		ValidateClaimPath:              &claimadmission.Handler{Validator: h.validator},
		claimadmission.AdminAccessPath: &admission.Webhook{Handler: &claimadmission.AdminAccessHandler{Support: h.cluster, Namespaces: h.cluster}},
		podinject.Path:                 h.injector,
	}
}
