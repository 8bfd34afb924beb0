package scale

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// warningsKey carries the counter of warnings of one load in its requests' context.
type warningsKey struct{}

// dialsKey carries the counter of connections one load's requests dialed (reviews straight to a
// webhook: a request that found no idle connection dialed one, a TLS handshake on both sides,
// whether or not it then used it).
type dialsKey struct{}

// countWarnings is the harness client's warning handler: it counts instead of logging each.
type countWarnings struct{}

func (countWarnings) HandleWarningHeaderWithContext(ctx context.Context, code int, _ string, _ string) {
	if n, ok := ctx.Value(warningsKey{}).(*atomic.Int64); ok && code == 299 {
		n.Add(1)
	}
}

// driverMemoryLimit is the heap at which the load driver collects its garbage, instead of each
// time its heap doubles (GOGC=100).
const driverMemoryLimit = 1 << 30

// collectRarely has the load driver's collector run at driverMemoryLimit only, and returns what
// puts GOGC and GOMEMLIMIT back. The driver shares the machine's CPUs with the webhooks it
// measures, keeps 10–25 MB, and at 2,000 reviews a second used to collect twice a second: a
// collection that stopped its senders and receivers for a few milliseconds left hundreds of
// reviews waiting, which the webhook then got at once, and that burst grew both heaps, which
// collected more often still. Stalls of 0.3–0.9 s followed, on whichever webhook was being
// measured (docs/performance.md, "What the stalls were"). At the limit it collected every one to
// three minutes in a full run.
func collectRarely() (restore func()) {
	gogc := debug.SetGCPercent(-1)
	limit := debug.SetMemoryLimit(driverMemoryLimit)
	return func() {
		debug.SetMemoryLimit(limit)
		debug.SetGCPercent(gogc)
	}
}

// driverCollectAbove is the heap past which the driver collects between two loads
// (collectBetweenLoads). A load at 2,000 reviews a second for 10 s allocates about 200 MB in the
// driver, so a load started under it ends well under driverMemoryLimit, and no load is collected
// during.
const driverCollectAbove = 256 << 20

// collectBetweenLoads collects the driver's garbage now if its heap, live or not yet collected,
// holds more than driverCollectAbove. It is called where no request is in flight. Left to
// driverMemoryLimit, the collection came in the middle of a load every minute or two: 50–60 ms
// of marking and assists on a machine whose two CPUs the webhook shares, and the upstream example
// webhook, which bounds neither its connections nor its handshakes, went from there into a storm of
// handshakes for the rest of its second.
func collectBetweenLoads() { collectAbove(driverCollectAbove) }

// collectAbove collects now if the heap holds more than limit bytes, and says whether it did.
func collectAbove(limit uint64) bool {
	heap := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(heap)
	if heap[0].Value.Kind() != metrics.KindUint64 || heap[0].Value.Uint64() <= limit {
		return false
	}
	runtime.GC()
	return true
}

// maxInFlight bounds the requests the driver has outstanding; a tick that finds them all busy is
// counted as skipped rather than queued, so a stalled server cannot pile up unbounded work.
const maxInFlight = 512

// result is one load run: how many requests were sent at what rate, how they ended, and the
// latency of those that got an answer from the API server (admitted or denied).
type result struct {
	Name     string
	Rate     int
	Sent     int
	Skipped  int
	Failed   int
	Timeouts int // the API server could not get an answer from the webhook
	Warned   int // admitted with a warning (e.g. the feasibility check's)
	Dials    int // connections dialed (reviews straight to a webhook)
	Lat      []time.Duration
	// Answers are when each answered request was sent, from the load's start, beside its latency:
	// which moments of a load were slow. Lat is their latencies, sorted.
	Answers  []answer
	FirstErr string
	// Steal is the share of the machine's CPU time the host took while the load ran; CPU the
	// webhook's own CPU time per request sent.
	Steal float64
	CPU   time.Duration
	// Busy is the share of the machine's CPU time any process ran while the load ran (the
	// webhook, the load driver, the control plane).
	Busy float64
}

// answer is one answered request of a load.
type answer struct{ At, Lat time.Duration }

// merge adds o's requests to r (whose latencies then need sorting).
func (r *result) merge(o *result) {
	r.Sent += o.Sent
	r.Skipped += o.Skipped
	r.Failed += o.Failed
	r.Timeouts += o.Timeouts
	r.Warned += o.Warned
	r.Dials += o.Dials
	r.Lat = append(r.Lat, o.Lat...)
	r.Answers = append(r.Answers, o.Answers...)
	if r.FirstErr == "" {
		r.FirstErr = o.FirstErr
	}
}

func (r *result) percentile(p float64) time.Duration {
	if len(r.Lat) == 0 {
		return 0
	}
	i := int(float64(len(r.Lat))*p+0.5) - 1
	return r.Lat[min(max(i, 0), len(r.Lat)-1)]
}

func (r *result) P50() time.Duration { return r.percentile(0.50) }
func (r *result) P99() time.Duration { return r.percentile(0.99) }

func (r *result) String() string {
	s := fmt.Sprintf("%s at %d/s: sent %d, p50 %s, p99 %s, max %s, warned %d, failed %d (webhook not answering %d), skipped %d",
		r.Name, r.Rate, r.Sent, ms(r.P50()), ms(r.P99()), ms(r.percentile(1)), r.Warned, r.Failed, r.Timeouts, r.Skipped)
	if r.Dials > 0 {
		s += fmt.Sprintf(", connections dialed %d", r.Dials)
	}
	s += fmt.Sprintf(", host steal %.0f%%, machine busy %.0f%%, webhook CPU %s per request", r.Steal, r.Busy, us(r.CPU))
	if r.FirstErr != "" {
		s += ", first error: " + r.FirstErr
	}
	return s
}

func us(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond)) }

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// drive calls op at rate per second for count calls (open loop: a slow answer does not slow the
// sender), each with its own deadline, and collects the latencies.
func drive(ctx context.Context, name string, rate, count int, op func(ctx context.Context, i int) error) *result {
	r := &result{Name: name, Rate: rate}
	var warned, dialed atomic.Int64
	ctx = context.WithValue(context.WithValue(ctx, warningsKey{}, &warned), dialsKey{}, &dialed)
	defer func() { r.Warned, r.Dials = int(warned.Load()), int(dialed.Load()) }()
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxInFlight)
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := range count {
		// Ticks are computed from the start, not slept one after another, so that the rate holds.
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			select {
			case <-ctx.Done():
				r.Skipped += count - i
				wg.Wait()
				return r.sorted()
			case <-time.After(d):
			}
		}
		select {
		case sem <- struct{}{}:
		default:
			r.Skipped++
			continue
		}
		r.Sent++
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			octx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			t := time.Now()
			err := op(octx, i)
			d := time.Since(t)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				r.Failed++
				if msg := err.Error(); strings.Contains(msg, "failed calling webhook") || strings.Contains(msg, "context deadline exceeded") {
					r.Timeouts++
				}
				if r.FirstErr == "" {
					r.FirstErr = err.Error()
				}
				return
			}
			r.Answers = append(r.Answers, answer{At: t.Sub(start), Lat: d})
		}()
	}
	wg.Wait()
	return r.sorted()
}

// sorted sets Lat to the answers' latencies, sorted.
func (r *result) sorted() *result {
	r.Lat = make([]time.Duration, len(r.Answers))
	for i, a := range r.Answers {
		r.Lat[i] = a.Lat
	}
	slices.Sort(r.Lat)
	return r
}
