// Package fleetmetrics exports what the webhook knows of the whole fleet as Prometheus gauges: its
// driver's devices by model and use, and the ResourceClaims waiting for an allocation by how long.
// The sums are made at each rebuild of the index of current allocations (diagnosis.Held), which
// reads every slice and claim anyway; a scrape reads the last sums at a cost that does not grow
// with the fleet, and nothing here runs on the review path.
package fleetmetrics

import (
	"cmp"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra/internal/analysis/diagnosis"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
)

const (
	// MaxModels bounds the model label's values: anyone allowed to write ResourceSlices can name
	// models, so beyond the MaxModels-1 models with the most devices the rest count as OtherModel.
	MaxModels = 32
	// MaxModelLength bounds a model label value, in bytes (the API server allows 64 characters).
	MaxModelLength = 64
	// OtherModel is the model label of the devices whose models are beyond MaxModels.
	OtherModel = "(other)"
)

// Sources of a pending claim: the source label.
const (
	// SourceTemplate: the claim is controlled by a Pod, which the ResourceClaim controller made
	// it for from the pod's ResourceClaimTemplate: that pod waits for it.
	SourceTemplate = "template"
	// SourceStandalone: any other claim, which may wait for no pod at all.
	SourceStandalone = "standalone"
)

var sources = []string{SourceTemplate, SourceStandalone}

// pendingThresholds are the older_than label's values: claims pending for longer than each.
var pendingThresholds = []struct {
	label string
	age   time.Duration
}{{"0s", 0}, {"1m", time.Minute}, {"5m", 5 * time.Minute}, {"15m", 15 * time.Minute}, {"1h", time.Hour}, {"6h", 6 * time.Hour}}

// Collector is a prometheus.Collector of the fleet gauges. Observe feeds it; it is safe for
// concurrent use.
type Collector struct {
	driver  string
	now     func() time.Time
	refresh func()
	latest  atomic.Pointer[summary]

	devices, pending, oldest *prometheus.Desc
	dropped                  prometheus.Counter
}

// summary is one rebuild's sums.
type summary struct {
	// models are sorted by name; counts are indexed like deviceusage.Uses.
	models []modelCount
	// folded is how many models count as OtherModel.
	folded int
	// created are the pending claims' creation times (Unix nanoseconds), ascending, by source
	// (indexed like sources).
	created [2][]int64
}

type modelCount struct {
	model  string
	counts [4]int
	total  int
}

// Option configures a Collector.
type Option func(*Collector)

// WithClock makes the pending claims' ages be measured against now (tests).
func WithClock(now func() time.Time) Option { return func(c *Collector) { c.now = now } }

// WithRefresh has a scrape that finds nothing observed yet call refresh, which should start a
// rebuild in the background: the last change before the caches synced may have found nothing to
// build from, and a quiet cluster brings no other.
func WithRefresh(refresh func()) Option { return func(c *Collector) { c.refresh = refresh } }

// New returns a collector of driver's devices.
func New(driver string, opts ...Option) *Collector {
	c := &Collector{
		driver: driver,
		now:    time.Now,
		devices: prometheus.NewDesc("gpu_dra_fleet_devices",
			"Devices of the driver published in ResourceSlices, by model and use: free, allocated (held by claims, or shares of it), blocked (its partitions' counters used by others), unhealthy (a NoSchedule or NoExecute taint, held or not).",
			[]string{"model", "state"}, nil),
		pending: prometheus.NewDesc("gpu_dra_fleet_claims_pending",
			"ResourceClaims without an allocation created longer ago than older_than, by source: template (made for a pod from its ResourceClaimTemplate), standalone.",
			[]string{"source", "older_than"}, nil),
		oldest: prometheus.NewDesc("gpu_dra_fleet_claims_pending_oldest_seconds",
			"Age of the oldest ResourceClaim without an allocation, by source; 0 when none waits.",
			[]string{"source"}, nil),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpu_dra_fleet_model_series_dropped_total",
			Help: "Model series left out of scrapes because the fleet publishes more models than the cap; their devices count under model \"" + OtherModel + "\".",
		}),
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.devices
	ch <- c.pending
	ch <- c.oldest
	c.dropped.Describe(ch)
}

// Collect implements prometheus.Collector: the last sums, and the pending claims' ages as of now.
// Nothing is exported before the first Observe.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.latest.Load()
	if s == nil {
		if c.refresh != nil {
			c.refresh()
		}
		c.dropped.Collect(ch)
		return
	}
	for _, m := range s.models {
		for i, use := range deviceusage.Uses {
			ch <- prometheus.MustNewConstMetric(c.devices, prometheus.GaugeValue, float64(m.counts[i]), m.model, string(use))
		}
	}
	c.dropped.Add(float64(s.folded))
	c.dropped.Collect(ch)
	now := c.now().UnixNano()
	for i, source := range sources {
		created := s.created[i]
		for _, th := range pendingThresholds {
			// The claims created before now-age; those created "after now" (a clock ahead of
			// ours) have waited for no time.
			n := sort.Search(len(created), func(k int) bool { return created[k] >= now-int64(th.age) })
			if th.age == 0 {
				n = len(created)
			}
			ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(n), source, th.label)
		}
		oldest := 0.0
		if len(created) > 0 {
			oldest = max(0, time.Duration(now-created[0]).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, oldest, source)
	}
}

// Observe sums one rebuild: a diagnosis.WithRebuildObserver.
func (c *Collector) Observe(r diagnosis.Rebuilt) {
	s := &summary{}
	s.models, s.folded = c.countDevices(r.Slices, r.Fleet)
	s.created = pendingClaims(r.Claims, c.now())
	c.latest.Store(s)
}

type poolKey struct{ driver, pool string }

// countDevices counts the driver's devices by model and use. Only the newest generation of each
// pool counts, as for the scheduler: a driver replacing its slices publishes both for a moment.
// A device of a pool the fleet left out (not busy) is free.
func (c *Collector) countDevices(published []*inventory.Slice, fleet *deviceusage.Fleet) ([]modelCount, int) {
	newest := map[string]int64{}
	for _, sl := range published {
		if sl.Spec.Driver == c.driver {
			newest[sl.Spec.Pool.Name] = max(newest[sl.Spec.Pool.Name], sl.Spec.Pool.Generation)
		}
	}
	busy := map[poolKey]bool{}
	if fleet != nil {
		for _, sl := range fleet.Slices {
			busy[poolKey{sl.Spec.Driver, sl.Spec.Pool.Name}] = true
		}
	}
	byModel := map[string]*modelCount{}
	for _, sl := range published {
		if sl.Spec.Driver != c.driver || sl.Spec.Pool.Generation < newest[sl.Spec.Pool.Name] {
			continue
		}
		inBusy := busy[poolKey{sl.Spec.Driver, sl.Spec.Pool.Name}]
		for i := range sl.Spec.Devices {
			use := deviceusage.UseFree
			if inBusy {
				if d := fleet.DeviceNamed(sl.Spec.Driver, sl.Spec.Pool.Name, sl.Spec.Devices[i].Name); d != nil {
					use = d.Use()
				}
			}
			model := modelLabel(sl, i)
			m := byModel[model]
			if m == nil {
				m = &modelCount{model: model}
				byModel[model] = m
			}
			m.counts[slices.Index(deviceusage.Uses, use)]++
			m.total++
		}
	}
	return capModels(byModel)
}

// capModels keeps the MaxModels-1 models with the most devices (the first by name among equals)
// and counts the others as OtherModel, when there are more than MaxModels; sorted by model.
func capModels(byModel map[string]*modelCount) ([]modelCount, int) {
	models := make([]modelCount, 0, len(byModel))
	for _, m := range byModel {
		models = append(models, *m)
	}
	folded := 0
	if len(models) > MaxModels {
		slices.SortFunc(models, func(a, b modelCount) int { return cmp.Or(cmp.Compare(b.total, a.total), cmp.Compare(a.model, b.model)) })
		other := modelCount{model: OtherModel}
		for _, m := range models[MaxModels-1:] {
			for i := range other.counts {
				other.counts[i] += m.counts[i]
			}
			other.total += m.total
		}
		folded = len(models) - (MaxModels - 1)
		models = append(models[:MaxModels-1], other)
	}
	slices.SortFunc(models, func(a, b modelCount) int { return cmp.Compare(a.model, b.model) })
	return models, folded
}

// modelLabel is device i's model attribute in the slice's driver's domain, valid UTF-8 of at most
// MaxModelLength bytes; "" when it has none.
func modelLabel(sl *inventory.Slice, i int) string {
	a, ok := sl.Attribute(i, deviceschema.AttrModel)
	if !ok {
		a, ok = sl.Attribute(i, resourceapi.QualifiedName(sl.Spec.Driver+"/"+string(deviceschema.AttrModel)))
	}
	if !ok || a.StringValue == nil {
		return ""
	}
	return truncate(strings.ToValidUTF8(*a.StringValue, "\uFFFD"), MaxModelLength)
}

// truncate cuts s to at most n bytes without splitting a character.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// pendingClaims are the creation times of the claims without an allocation, ascending, by source;
// a claim without one counts as created now.
func pendingClaims(claims []*inventory.Claim, now time.Time) [2][]int64 {
	var out [2][]int64
	for _, c := range claims {
		if c.Allocated {
			continue
		}
		created := now.UnixNano()
		if c.Created != 0 {
			created = c.Created
		}
		i := 1
		if c.PodOwned {
			i = 0
		}
		out[i] = append(out[i], created)
	}
	for i := range out {
		slices.Sort(out[i])
	}
	return out
}
