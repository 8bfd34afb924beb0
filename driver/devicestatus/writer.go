// Package devicestatus records in each prepared claim's status.devices (KEP-4817) which devices
// the plugin prepared: per device its uuid, model, index and driverVersion as DeviceAttribute
// values, so `kubectl get resourceclaim` tells which GPU a claim got.
//
// Writes are server-side applies of the claim's status through the typed client of the newest
// resource.k8s.io version the cluster serves, made in the background: prepare only queues the
// claim, so its latency never includes a write. The queue holds at most one entry per claim and a
// bounded number of claims; a failed write is retried with backoff, a claim that is unprepared
// meanwhile is dropped, and a claim whose status already shows the same data is not written again.
// Where the API server drops the field (DRAResourceClaimDeviceStatus off, as by default before
// Kubernetes 1.33), the writer says so once and stops.
package devicestatus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/metrics"
)

// Defaults of the queue. A node prepares a few claims a minute; a thousand queued claims means the
// API server has been unreachable for a long time, and dropping more is better than growing.
const (
	DefaultMaxPending = 1000
	defaultAttempts   = 10
	defaultBaseDelay  = 250 * time.Millisecond
	defaultMaxDelay   = 30 * time.Second
)

// getFunc reads a claim as v1, whatever version the server serves.
type getFunc func(ctx context.Context, claim claimRef) (*resourceapi.ResourceClaim, error)

// Writer records the device status of prepared claims. Its methods may be called from any
// goroutine; Record, Resync and Forget never block on the API server.
type Writer struct {
	driver  string
	version string
	apply   applyFunc
	get     getFunc
	metrics *metrics.Metrics

	maxPending int
	attempts   int
	baseDelay  time.Duration
	maxDelay   time.Duration

	queue  workqueue.TypedRateLimitingInterface[types.UID]
	mutex  sync.Mutex
	jobs   map[types.UID]*job
	logger klog.Logger
	// off is set once the API server is known to drop status.devices.
	off atomic.Bool
}

// job is the latest wish for one claim; a newer Record replaces it.
type job struct {
	claim   claimRef
	devices []Device
	// observed is the claim's status.devices as read for the prepare; unknown after a restart.
	observed []resourceapi.AllocatedDeviceStatus
	known    bool
}

// Option configures a Writer.
type Option func(*Writer)

// WithMetrics counts writes given up on in the plugin's errors metric (component "claim_status").
func WithMetrics(m *metrics.Metrics) Option { return func(w *Writer) { w.metrics = m } }

// WithMaxPending bounds the number of queued claims (default DefaultMaxPending).
func WithMaxPending(n int) Option { return func(w *Writer) { w.maxPending = n } }

// WithRetry sets the attempts per claim and the exponential backoff between them.
func WithRetry(attempts int, base, max time.Duration) Option {
	return func(w *Writer) { w.attempts, w.baseDelay, w.maxDelay = attempts, base, max }
}

// New returns a writer for driver's entries in claims of resource.k8s.io/version, the newest
// version the server serves. Its client should have a rate limit of its own, so that background
// writes never make a prepare wait for the client's tokens.
func New(cs kubernetes.Interface, driver, version string, opts ...Option) (*Writer, error) {
	apply, err := applier(cs, version, driver, driver+"/kubelet-plugin")
	if err != nil {
		return nil, err
	}
	claims := draclient.New(cs)
	get := func(ctx context.Context, c claimRef) (*resourceapi.ResourceClaim, error) {
		return claims.ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	}
	return newWriter(driver, version, apply, get, opts...), nil
}

func newWriter(driver, version string, apply applyFunc, get getFunc, opts ...Option) *Writer {
	w := &Writer{
		driver: driver, version: version, apply: apply, get: get,
		maxPending: DefaultMaxPending, attempts: defaultAttempts, baseDelay: defaultBaseDelay, maxDelay: defaultMaxDelay,
		jobs:   map[types.UID]*job{},
		logger: klog.Background(),
	}
	for _, o := range opts {
		o(w)
	}
	w.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](w.baseDelay, w.maxDelay),
		workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "claim-device-status"})
	return w
}

// Start runs the writer until ctx ends or stop is called; stop waits for the write in flight.
func (w *Writer) Start(ctx context.Context) (stop func()) {
	w.logger = klog.FromContext(ctx).WithName("devicestatus")
	ctx, cancel := context.WithCancel(klog.NewContext(ctx, w.logger))
	done := make(chan struct{})
	// One worker: writes take a few milliseconds and nodes prepare a few claims a minute.
	go func() {
		defer close(done)
		for w.processNext(ctx) {
		}
	}()
	go func() { <-ctx.Done(); w.queue.ShutDown() }()
	return func() { cancel(); <-done }
}

// Record queues a prepared claim's devices. claim is the object the prepare read; when its status
// already shows the same data, nothing is written.
func (w *Writer) Record(claim *resourceapi.ResourceClaim, devices []Device) {
	w.enqueue(&job{
		claim:    claimRef{Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID},
		devices:  devices,
		observed: claim.Status.Devices,
		known:    true,
	})
}

// Resync queues a claim prepared before this process started: its status is read first.
func (w *Writer) Resync(namespace, name string, uid types.UID, devices []Device) {
	w.enqueue(&job{claim: claimRef{Namespace: namespace, Name: name, UID: uid}, devices: devices})
}

// Forget drops queued work of an unprepared claim. A write in flight may still land; the API
// server clears status.devices when the claim is deallocated anyway.
func (w *Writer) Forget(uid types.UID) {
	w.mutex.Lock()
	delete(w.jobs, uid)
	w.mutex.Unlock()
	w.queue.Forget(uid)
}

// Pending is the number of queued claims.
func (w *Writer) Pending() int {
	w.mutex.Lock()
	defer w.mutex.Unlock()
	return len(w.jobs)
}

func (w *Writer) enqueue(j *job) {
	if w.off.Load() || len(j.devices) == 0 {
		return
	}
	w.mutex.Lock()
	if _, queued := w.jobs[j.claim.UID]; !queued && len(w.jobs) >= w.maxPending {
		w.mutex.Unlock()
		w.giveUp(j.claim, fmt.Errorf("%d claims are waiting for their status already", w.maxPending))
		return
	}
	w.jobs[j.claim.UID] = j
	w.mutex.Unlock()
	w.queue.Add(j.claim.UID)
}

func (w *Writer) processNext(ctx context.Context) bool {
	uid, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(uid)
	w.mutex.Lock()
	j := w.jobs[uid]
	w.mutex.Unlock()
	if j == nil || w.off.Load() {
		w.queue.Forget(uid)
		return true
	}
	err := w.write(ctx, j)
	var final *finalError
	switch {
	case err == nil:
	case errors.As(err, &final):
		w.giveUp(j.claim, final.err)
	case w.queue.NumRequeues(uid)+1 >= w.attempts:
		w.giveUp(j.claim, fmt.Errorf("after %d attempts: %w", w.attempts, err))
	default:
		w.logger.V(2).Info("Writing claim device status failed; retrying", "claim", j.claim.ref(), "err", err)
		w.queue.AddRateLimited(uid)
		return true
	}
	w.queue.Forget(uid)
	w.mutex.Lock()
	if w.jobs[uid] == j { // a newer Record is queued again by its Add
		delete(w.jobs, uid)
	}
	w.mutex.Unlock()
	return true
}

// finalError is a failure that retrying will not fix.
type finalError struct{ err error }

func (e *finalError) Error() string { return e.err.Error() }

// write brings one claim's status in line with its devices.
func (w *Writer) write(ctx context.Context, j *job) error {
	want, err := entries(j.devices)
	if err != nil {
		// The other devices are still worth recording.
		w.logger.Error(err, "Device status data not recorded", "claim", j.claim.ref())
	}
	if len(want) == 0 {
		return nil
	}
	observed := j.observed
	if !j.known {
		claim, err := w.get(ctx, j.claim)
		switch {
		case apierrors.IsNotFound(err), err == nil && claim.UID != j.claim.UID:
			return nil // gone; nothing to record
		case err != nil:
			return fmt.Errorf("get claim: %w", err)
		case claim.Status.Allocation == nil:
			return nil
		}
		observed = claim.Status.Devices
	}
	if recorded(w.driver, observed, want) {
		return nil
	}
	got, err := w.apply(ctx, j.claim, want)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsInvalid(err):
		// The claim changed under us (replaced, deallocated and reallocated elsewhere): the
		// status describes devices it no longer has.
		return &finalError{fmt.Errorf("the API server refused the status: %w", err)}
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%w (the plugin's ClusterRole needs patch on resourceclaims/status and, from Kubernetes 1.36, "+
			"associated-node:patch on resourceclaims/driver named %s)", err, w.driver)
	case err != nil:
		return err
	}
	if got.allocated && !recorded(w.driver, got.devices, want) {
		w.turnOff(j.claim)
	}
	return nil
}

// turnOff stops all writing once the API server showed that it drops status.devices: every
// further write would be dropped too.
func (w *Writer) turnOff(claim claimRef) {
	if w.off.Swap(true) {
		return
	}
	w.logger.Info("The API server drops ResourceClaim status.devices (feature gate DRAResourceClaimDeviceStatus is off; "+
		"it is alpha and off by default before Kubernetes 1.33): claims will not show their devices' uuid, model, index "+
		"and driverVersion; not writing device status again until the plugin restarts",
		"claim", claim.ref(), "apiVersion", "resource.k8s.io/"+w.version)
	w.mutex.Lock()
	clear(w.jobs)
	w.mutex.Unlock()
}

func (w *Writer) giveUp(claim claimRef, err error) {
	w.logger.Error(err, "Claim device status not written", "claim", claim.ref())
	if w.metrics != nil {
		w.metrics.Error(metrics.ComponentClaimStatus)
	}
}
