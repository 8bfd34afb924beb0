package scale

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"
)

// churnRounds measures template reviews to each binary while the claims change, round by round
// and binary by binary on the same control plane: a change of the held-now path judged against
// the build before it without a day between them.
func (m *memoryRun) churnRounds(ctx context.Context, out io.Writer, mo MemoryOptions, h *holder) error {
	o := m.o
	fmt.Fprintf(out, "\n### Template reviews at %d/s, %d claims changing at %d/s for %s (deadline %s; GOGC=%s GOMEMLIMIT=%s)\n\n",
		o.ClaimsRates[0], m.claims, o.ChurnRate, o.Duration, o.ReviewDeadline, o.GOGC, o.GOMemLimit)
	for round := range mo.Rounds {
		for _, bin := range mo.Webhooks {
			warm, c, err := m.churned(ctx, bin, o, h, fmt.Sprintf("churn-%d", round))
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "- round %d %s: %d of %d past the deadline; %s\n", round+1, filepath.Base(bin), c.Over, len(c.Reviews.Lat), c.Reviews)
			if c.Over > 0 {
				fmt.Fprintf(out, "  - past the deadline, by second of the load: %v\n", overBySecond(c.Reviews, o.ReviewDeadline))
			}
			fmt.Fprintf(out, "  - its first second of reviews, %d s after ready: %d of %d past the deadline; %s\n", int(settle.Seconds()), over(warm.Lat, o.ReviewDeadline), len(warm.Lat), warm)
		}
	}
	return nil
}

// churned starts bin, lets it build its first fleet of the held claims, sends it a second of the
// reviews (warm: the first answers to each question are found then), and runs the churn load
// against it.
func (m *memoryRun) churned(ctx context.Context, bin string, o Options, h *holder, dir string) (warm *result, c *churnResult, err error) {
	w, _, err := m.start(ctx, bin, o, dir)
	if err != nil {
		return nil, nil, err
	}
	defer w.stop()
	templates, _, err := m.ch.reviewers(w, m.l)
	if err != nil {
		return nil, nil, err
	}
	time.Sleep(settle)
	rate := o.ClaimsRates[0]
	warm = sampled(w.pid(), func() *result {
		return drive(ctx, "template reviews to the webhook, first second", rate, rate, templates.review)
	})
	if c, err = churnLoad(ctx, o, h, templates.target(w.pid())); err != nil {
		return nil, nil, err
	}
	m.logger.Info("Churn done", "webhook", bin, "overDeadline", c.Over, "firstSecond", warm.String(), "changes", c.Changes.String(), "reviews", c.Reviews.String())
	return warm, c, nil
}
