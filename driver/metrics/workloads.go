package metrics

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/podresources"
)

// DefaultMaxAllocationSeries bounds the allocation series of one node: 8 GPUs × 16 shares, each
// used by a few containers, is a few hundred; beyond the cap series are counted, not exported.
const DefaultMaxAllocationSeries = 2048

// consumersTimeout bounds what one scrape waits for the kubelet.
const consumersTimeout = 2 * time.Second

// DeviceInfo is one published device: what a per-GPU series of another exporter is joined on.
type DeviceInfo struct {
	Device, UUID, Model string
	// Partition is the partition's number for a partition of a GPU, "full" for the whole GPU of a
	// partitioned one, "" otherwise.
	Partition string
}

// PreparedDevice is one device of a claim prepared on this node.
type PreparedDevice struct {
	Namespace, Claim, Request string
	Device, ShareID           string
}

// workloads exports which device each prepared claim holds and which containers use it,
// computed at each scrape from what the plugin recorded last and the kubelet's answer: a series
// goes with its claim's unprepare, and none is kept between scrapes.
type workloads struct {
	info, allocation *prometheus.Desc
	dropped          prometheus.Counter
	max              int

	mu        sync.Mutex
	devices   map[string]DeviceInfo
	prepared  []PreparedDevice
	consumers podresources.Lister
}

func newWorkloads(max int) *workloads {
	return &workloads{
		info: prometheus.NewDesc("gpu_dra_device_info",
			"One series per device this node publishes: its uuid, model and partition, for joining other exporters' per-GPU series on uuid.",
			[]string{"device", "uuid", "model", "partition"}, nil),
		allocation: prometheus.NewDesc("gpu_dra_device_allocation",
			"One series per prepared device and container using it (pod and container empty when the kubelet does not say): who holds which GPU.",
			[]string{"device", "uuid", "partition", "namespace", "pod", "container", "claim", "request", "share_id"}, nil),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "allocation_series_dropped_total",
			Help: "Allocation series left out of scrapes because the node had more than the cap.",
		}),
		max: max,
	}
}

func (w *workloads) Describe(ch chan<- *prometheus.Desc) {
	ch <- w.info
	ch <- w.allocation
	w.dropped.Describe(ch)
}

func (w *workloads) Collect(ch chan<- prometheus.Metric) {
	w.mu.Lock()
	devices, prepared, lister := w.devices, w.prepared, w.consumers
	w.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(devices)) {
		d := devices[name]
		ch <- prometheus.MustNewConstMetric(w.info, prometheus.GaugeValue, 1, d.Device, d.UUID, d.Model, d.Partition)
	}
	var consumers []podresources.Consumer
	if lister != nil && len(prepared) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), consumersTimeout)
		var err error
		consumers, err = lister.Consumers(ctx)
		cancel()
		if err != nil {
			// Without the kubelet's answer the series still say which claim holds which device.
			klog.Background().V(4).Info("Pod resources unavailable; allocation series without pods", "err", err)
		}
	}
	n := 0
	for _, s := range allocationSeries(prepared, consumers) {
		if n == w.max {
			w.dropped.Inc()
			continue
		}
		n++
		d := devices[s.Device]
		ch <- prometheus.MustNewConstMetric(w.allocation, prometheus.GaugeValue, 1,
			s.Device, d.UUID, d.Partition, s.Namespace, s.pod, s.container, s.Claim, s.Request, s.ShareID)
	}
	w.dropped.Collect(ch)
}

type series struct {
	PreparedDevice
	pod, container string
}

// allocationSeries joins each prepared device with the containers the kubelet says use it. A
// prepared device no container is known to use (not started yet, or the kubelet did not say)
// is one series without pod and container.
func allocationSeries(prepared []PreparedDevice, consumers []podresources.Consumer) []series {
	type key struct{ ns, claim string }
	byClaim := map[key][]podresources.Consumer{}
	for _, c := range consumers {
		k := key{c.ClaimNamespace, c.ClaimName}
		byClaim[k] = append(byClaim[k], c)
	}
	var out []series
	for _, p := range prepared {
		matched := false
		for _, c := range byClaim[key{p.Namespace, p.Claim}] {
			// Kubelets before 1.31 name no device: every device of the claim is the container's.
			if c.Device != "" && (c.Device != p.Device || (c.ShareID != "" && c.ShareID != p.ShareID)) {
				continue
			}
			out = append(out, series{PreparedDevice: p, pod: c.Pod, container: c.Container})
			matched = true
		}
		if !matched {
			out = append(out, series{PreparedDevice: p})
		}
	}
	// One container may list a claim's device once per request using it: one series each.
	slices.SortFunc(out, compare)
	return slices.Compact(out)
}

func compare(a, b series) int {
	ka := [...]string{a.Namespace, a.Claim, a.Device, a.ShareID, a.Request, a.pod, a.container}
	kb := [...]string{b.Namespace, b.Claim, b.Device, b.ShareID, b.Request, b.pod, b.container}
	for i := range ka {
		if c := strings.Compare(ka[i], kb[i]); c != 0 {
			return c
		}
	}
	return 0
}
