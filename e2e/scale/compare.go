package scale

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
)

// A load straight to the webhooks runs in rounds, each interleaving the fleet's webhook and the
// baseline's, until quietRounds rounds had host steal under quietSteal percent, at most maxRounds.
const (
	quietRounds = 3
	maxRounds   = 8
	quietSteal  = 3.0
)

// pair is one round of a load on the fleet's webhook and the baseline's (interleaved), and the
// most of one CPU the control planes' processes took in a second of it.
type pair struct {
	fleet, base  *result
	ControlPlane float64
}

// quietControlPlane is the share of one CPU the control planes may take in a second of a round
// that counts as quiet. With the controllers paused they take little (0.05–0.17 in a round's
// busiest second), except when a kube-apiserver that has not collected its heap for two minutes is
// made to (Go forces a collection every two minutes): at 5,000 nodes 0.5–1 s of 0.6–1.1 CPUs, on the
// two CPUs the webhooks and the driver share. Such a second leaves reviews waiting, the client
// dials for them, and the p99 of the round is the control plane's. In production the API server
// does not run on the webhook's CPUs, so the round is run again, as one with steal is.
const quietControlPlane = 0.25

// interleaved sends count calls to a and count to b at rate, a second of one, then a second of
// the other: the host's steal comes and goes within a minute, and a p99 compared with one
// measured a minute earlier compares the host. Before each second the driver collects its
// garbage if it has much (collectBetweenLoads), and after it waits for the connections its
// client was still making (target.settle), so that neither lands in the other's second.
func interleaved(ctx context.Context, name string, rate, count int, a, b target) pair {
	p := pair{fleet: &result{Name: name, Rate: rate}, base: &result{Name: name + " (baseline)", Rate: rate}}
	cp := findControlPlanes()
	for sent := 0; sent < count; sent += rate {
		n := min(rate, count-sent)
		for _, turn := range []struct {
			t    target
			into *result
		}{{a, p.fleet}, {b, p.base}} {
			collectBetweenLoads()
			before := cp.sample()
			turn.into.merge(drive(ctx, name, rate, n, turn.t.review))
			p.ControlPlane = max(p.ControlPlane, cp.since(before))
			turn.t.settle(ctx)
		}
	}
	slices.Sort(p.fleet.Lat)
	slices.Sort(p.base.Lat)
	return p
}

func (p pair) quiet() bool {
	return p.fleet.Steal < quietSteal && p.base.Steal < quietSteal && p.ControlPlane < quietControlPlane
}

func (p pair) ratio() float64 {
	if p.base.P99() <= 0 {
		return 0
	}
	return float64(p.fleet.P99()) / float64(p.base.P99())
}

// enoughQuiet: pairs has quietRounds quiet rounds.
func enoughQuiet(pairs []pair) bool {
	n := 0
	for _, p := range pairs {
		if p.quiet() {
			n++
		}
	}
	return n >= quietRounds
}

// comparison is a repeated load on both webhooks: the round with the median ratio of p99s, taken
// over the quiet rounds (over all when fewer than quietRounds were quiet).
type comparison struct {
	Fleet, Base *result
	Ratio       float64
	Pairs       []pair
	Quiet       int
	// Against names the webhook Base measured: baselineLabel or upstreamLabel.
	Against string
}

// baselineLabel names the 1-node baseline webhook in the report.
const baselineLabel = "the 1-node baseline"

// upstreamLabel names the upstream example driver's webhook in the report.
const upstreamLabel = "the upstream example webhook"

func compare(pairs []pair, against string) *comparison {
	counted := slices.DeleteFunc(slices.Clone(pairs), func(p pair) bool { return !p.quiet() })
	if len(counted) < quietRounds {
		counted = slices.Clone(pairs)
	}
	slices.SortStableFunc(counted, func(a, b pair) int { return cmp.Compare(a.ratio(), b.ratio()) })
	m := counted[len(counted)/2]
	return &comparison{Fleet: m.fleet, Base: m.base, Ratio: m.ratio(), Pairs: pairs, Quiet: len(counted), Against: against}
}

// String lists every pair: p99 on the fleet's webhook / on the other one's, the steal of both and
// the control planes' busiest second.
func (c *comparison) String() string {
	p := make([]string, len(c.Pairs))
	for i, pr := range c.Pairs {
		p[i] = fmt.Sprintf("%s / %s (steal %.0f%%, control plane %.2f CPU", ms(pr.fleet.P99()), ms(pr.base.P99()), pr.fleet.Steal, pr.ControlPlane)
		if !pr.quiet() {
			p[i] += ", not quiet"
		}
		p[i] += ")"
	}
	return fmt.Sprintf("p99 %.2f× %s's (median of %d of %d rounds; every round, p99 here / there: %s)", c.Ratio, c.Against, c.Quiet, len(c.Pairs), strings.Join(p, ", "))
}
