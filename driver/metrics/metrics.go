// Package metrics defines the plugin's Prometheus metrics on a registry of its own, so tests and
// several plugin instances in one process do not collide on the global registry.
package metrics

import (
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpu-dra/gpu-dra/driver/podresources"
)

const namespace = "gpu_dra_plugin"

// Result labels.
const (
	ResultSuccess = "success"
	ResultError   = "error"
)

// Component is where an error counted in errors_total happened: its component label.
type Component string

// The components errors_total counts; Components lists them all, and the metric's help is built
// from that list, so that it names exactly what is emitted.
const (
	ComponentPrepare    Component = "prepare"
	ComponentUnprepare  Component = "unprepare"
	ComponentCheckpoint Component = "checkpoint"
	// ComponentPublish: the kubeletplugin library failed to publish ResourceSlices; it retries.
	ComponentPublish Component = "publish"
	// ComponentPublishDroppedFields: the API server dropped fields of a published slice (a
	// feature gate off), so the cluster sees less than the plugin publishes.
	ComponentPublishDroppedFields Component = "publish_dropped_fields"
	// ComponentGRPC: any other background error of the library, which ends the plugin.
	ComponentGRPC Component = "grpc"
	// ComponentClaimStatus: a claim's status.devices could not be written.
	ComponentClaimStatus Component = "claim_status"
)

// Components are all values of the errors_total component label.
var Components = []Component{ComponentPrepare, ComponentUnprepare, ComponentCheckpoint, ComponentPublish,
	ComponentPublishDroppedFields, ComponentGRPC, ComponentClaimStatus}

// Metrics holds the collectors. The zero value is not usable; use New.
type Metrics struct {
	Registry *prometheus.Registry

	prepares         *prometheus.CounterVec
	unprepares       *prometheus.CounterVec
	prepareLatency   prometheus.Histogram
	unprepareLatency prometheus.Histogram
	preparedClaims   prometheus.Gauge
	errors           *prometheus.CounterVec
	devices          *prometheus.GaugeVec
	faults           *prometheus.GaugeVec
	workloads        *workloads
}

// Option configures Metrics.
type Option func(*Metrics)

// WithConsumers names the containers using each prepared device in the allocation series (the
// kubelet's PodResources API); without it the series name claims only.
func WithConsumers(l podresources.Lister) Option {
	return func(m *Metrics) { m.workloads.consumers = l }
}

// WithMaxAllocationSeries caps the allocation series of one scrape.
func WithMaxAllocationSeries(n int) Option { return func(m *Metrics) { m.workloads.max = n } }

// New registers the plugin's metrics plus the Go and process collectors.
func New(opts ...Option) *Metrics {
	// Prepare runs in microseconds to milliseconds; the default buckets start at 5ms and would put
	// everything in the first bucket.
	buckets := prometheus.ExponentialBuckets(0.0001, 2, 16)
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		prepares: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "prepare_claims_total",
			Help: "ResourceClaims prepared, by result.",
		}, []string{"result"}),
		unprepares: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "unprepare_claims_total",
			Help: "ResourceClaims unprepared, by result.",
		}, []string{"result"}),
		prepareLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "prepare_duration_seconds",
			Help: "Time to prepare one ResourceClaim (CDI spec and checkpoint written).", Buckets: buckets,
		}),
		unprepareLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "unprepare_duration_seconds",
			Help: "Time to unprepare one ResourceClaim.", Buckets: buckets,
		}),
		preparedClaims: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "prepared_claims",
			Help: "ResourceClaims currently prepared on this node (checkpoint entries).",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "errors_total",
			Help: "Errors by component: " + componentList() + ".",
		}, []string{"component"}),
		devices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "devices",
			Help: "Devices this node publishes, by health: healthy, unhealthy (a fault is reported for it).",
		}, []string{"health"}),
		faults: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "device_faults",
			Help: "Faulty devices on this node, by fault kind.",
		}, []string{"kind"}),
		workloads: newWorkloads(DefaultMaxAllocationSeries),
	}
	for _, o := range opts {
		o(m)
	}
	m.Registry.MustRegister(m.prepares, m.unprepares, m.prepareLatency, m.unprepareLatency, m.preparedClaims, m.errors, m.devices, m.faults,
		m.workloads, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// ObservePrepare records one claim's prepare.
func (m *Metrics) ObservePrepare(d time.Duration, err error) {
	m.prepares.WithLabelValues(result(err)).Inc()
	m.prepareLatency.Observe(d.Seconds())
	if err != nil {
		m.Error(ComponentPrepare)
	}
}

// ObserveUnprepare records one claim's unprepare.
func (m *Metrics) ObserveUnprepare(d time.Duration, err error) {
	m.unprepares.WithLabelValues(result(err)).Inc()
	m.unprepareLatency.Observe(d.Seconds())
	if err != nil {
		m.Error(ComponentUnprepare)
	}
}

// SetPrepared records what is prepared on the node now: the number of claims and their devices.
func (m *Metrics) SetPrepared(claims int, devices []PreparedDevice) {
	m.preparedClaims.Set(float64(claims))
	m.workloads.mu.Lock()
	defer m.workloads.mu.Unlock()
	m.workloads.prepared = devices
}

// SetDevices records the devices the node publishes.
func (m *Metrics) SetDevices(devices []DeviceInfo) {
	byName := make(map[string]DeviceInfo, len(devices))
	for _, d := range devices {
		byName[d.Device] = d
	}
	m.workloads.mu.Lock()
	defer m.workloads.mu.Unlock()
	m.workloads.devices = byName
}

// Health label values of the devices gauge.
const (
	HealthHealthy   = "healthy"
	HealthUnhealthy = "unhealthy"
)

// SetDeviceHealth sets the devices gauge and the faults per kind; every kind in kinds is set, to 0
// when no device has it, so that a cleared fault shows as 0 rather than as a stale series.
func (m *Metrics) SetDeviceHealth(devices int, faultsByKind map[string]int, kinds []string) {
	unhealthy := 0
	for _, k := range kinds {
		m.faults.WithLabelValues(k).Set(float64(faultsByKind[k]))
		unhealthy += faultsByKind[k]
	}
	m.devices.WithLabelValues(HealthUnhealthy).Set(float64(unhealthy))
	m.devices.WithLabelValues(HealthHealthy).Set(float64(max(devices-unhealthy, 0)))
}

// Error counts an error of a component.
func (m *Metrics) Error(c Component) { m.errors.WithLabelValues(string(c)).Inc() }

func componentList() string {
	names := make([]string, len(Components))
	for i, c := range Components {
		names[i] = string(c)
	}
	return strings.Join(names, ", ")
}

func result(err error) string {
	if err != nil {
		return ResultError
	}
	return ResultSuccess
}
