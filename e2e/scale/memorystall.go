package scale

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// stallAt is how far into a stall load the webhook is stopped: after the connections of the
// load's start have settled.
const stallAt = 3 * time.Second

// lateAfterStall is the latency past which an answer counts as held up by the stall: several
// times a clean round's p99 at the top rate.
const lateAfterStall = 10 * time.Millisecond

// stallRounds sends template reviews at the top claims rate, without claims, to each binary and
// to the upstream example webhook, and stops each (SIGSTOP) for mo.Stall stallAt into the load:
// the same backlog for every webhook, at a moment the harness chooses. What a round reports is
// how the webhook came back from it: how long after it resumed its answers were late, and how many
// connections the client dialed meanwhile (each a TLS handshake on both sides of the machine).
func (m *memoryRun) stallRounds(ctx context.Context, out io.Writer, mo MemoryOptions, driver string) error {
	o := m.o
	rate := o.ClaimsRates[len(o.ClaimsRates)-1]
	fmt.Fprintf(out, "\n### Template reviews at %d/s for %s, no claims, each webhook stopped for %s %s into the load (late: over %s)\n\n",
		rate, o.Duration, mo.Stall, stallAt, lateAfterStall)
	for round := range mo.Rounds {
		for _, bin := range mo.Webhooks {
			res, err := m.stallOurs(ctx, bin, o, rate, mo.Stall, fmt.Sprintf("stall-%d", round))
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "- round %d %s: %s\n", round+1, filepath.Base(bin), res)
		}
		if o.Upstream != "" {
			res, err := m.stallUpstream(ctx, driver, rate, mo.Stall, round)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "- round %d upstream %s: %s\n", round+1, filepath.Base(o.Upstream), res)
		}
	}
	return nil
}

func (m *memoryRun) stallOurs(ctx context.Context, bin string, o Options, rate int, stall time.Duration, dir string) (*stallResult, error) {
	w, _, err := m.start(ctx, bin, o, dir)
	if err != nil {
		return nil, err
	}
	defer w.stop()
	templates, _, err := m.ch.reviewers(w, m.l)
	if err != nil {
		return nil, err
	}
	time.Sleep(settle)
	return stalled(ctx, o, rate, stall, templates.target(w.pid()))
}

func (m *memoryRun) stallUpstream(ctx context.Context, driver string, rate int, stall time.Duration, round int) (*stallResult, error) {
	u, err := startUpstream(ctx, m.o.Upstream, driver, filepath.Join(m.o.WorkDir, fmt.Sprintf("upstream-stall-%d", round)))
	if err != nil {
		return nil, err
	}
	defer u.stop()
	rv, err := m.ch.upstreamTemplates(u, m.l)
	if err != nil {
		return nil, err
	}
	time.Sleep(settle)
	return stalled(ctx, m.o, rate, stall, rv.target(u.pid()))
}

// stallResult is one stall load: the load, and how it came back from the stall.
type stallResult struct {
	*result
	// Late is how many answers took over lateAfterStall; CaughtUp is when the last of them was
	// answered, from the moment the webhook resumed.
	Late     int
	CaughtUp time.Duration
}

func (s *stallResult) String() string {
	out := fmt.Sprintf("%d late, caught up %s after resuming; %s", s.Late, ms(s.CaughtUp), s.result)
	if s.Late > 0 {
		out += fmt.Sprintf("; late by second of the load: %v", overBySecond(s.result, lateAfterStall))
	}
	return out
}

// stalled warms t's connections for a second, then drives reviews at rate for o.Duration and
// stops t's process for stall at stallAt.
func stalled(ctx context.Context, o Options, rate int, stall time.Duration, t target) (*stallResult, error) {
	name := "template reviews to the webhook, stalled"
	drive(ctx, name, rate, rate, t.review)
	t.settle(ctx)
	// Collected now, not in sampled after the stop's clock started.
	collectBetweenLoads()
	stopped := make(chan error, 1)
	go func() {
		select {
		case <-ctx.Done():
			stopped <- ctx.Err()
			return
		case <-time.After(stallAt):
		}
		if err := syscall.Kill(t.pid, syscall.SIGSTOP); err != nil {
			stopped <- fmt.Errorf("stop the webhook (pid %d): %w", t.pid, err)
			return
		}
		time.Sleep(stall)
		stopped <- syscall.Kill(t.pid, syscall.SIGCONT)
	}()
	klog.FromContext(ctx).Info("Stall load", "pid", t.pid, "rate", rate, "stallAt", stallAt, "stall", stall)
	res := sampled(t.pid, func() *result { return drive(ctx, name, rate, int(o.Duration.Seconds()*float64(rate)), t.review) })
	if err := <-stopped; err != nil {
		return nil, err
	}
	s := &stallResult{result: res}
	resumed := stallAt + stall
	for _, a := range res.Answers {
		if a.Lat <= lateAfterStall {
			continue
		}
		s.Late++
		s.CaughtUp = max(s.CaughtUp, a.At+a.Lat-resumed)
	}
	return s, nil
}
