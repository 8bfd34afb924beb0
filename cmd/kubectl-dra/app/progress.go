package app

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"
)

// progressDelay is how long a listing may take before the user is told what it waits for.
const progressDelay = time.Second

// progress reports on standard error what a slow listing still waits for: nothing when everything
// arrives within progressDelay, else one line then and one per list that completes afterwards.
type progress struct {
	w     io.Writer
	start time.Time
	now   func() time.Time

	mu      sync.Mutex
	shown   bool
	pending []string
	timer   *time.Timer
}

// newProgress starts the clock; after delay (progressDelay outside tests) it reports.
func newProgress(w io.Writer, delay time.Duration) *progress {
	p := &progress{w: w, start: time.Now(), now: time.Now}
	p.timer = time.AfterFunc(delay, p.show)
	return p
}

// begin registers a list that is about to be requested.
func (p *progress) begin(what string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending = append(p.pending, what)
}

// done records that a list arrived with n objects.
func (p *progress) done(what string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i := slices.Index(p.pending, what); i >= 0 {
		p.pending = slices.Delete(p.pending, i, i+1)
	}
	if p.shown {
		fmt.Fprintf(p.w, "kubectl dra: %d %s listed (%s)\n", n, what, p.elapsed())
	}
}

func (p *progress) show() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pending) == 0 {
		return
	}
	p.shown = true
	fmt.Fprintf(p.w, "kubectl dra: listing %s (%s)...\n", strings.Join(p.pending, ", "), p.elapsed())
}

// stop ends the reports; later completions print nothing.
func (p *progress) stop() {
	p.timer.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.shown = false
}

func (p *progress) elapsed() string {
	return p.now().Sub(p.start).Round(100 * time.Millisecond).String()
}
