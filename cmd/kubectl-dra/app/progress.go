package app

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

// progressDelay is how long a listing may take before the user is told what it waits for.
const progressDelay = time.Second

// progress reports on standard error what a slow listing still waits for: nothing when everything
// arrives within progressDelay, else one line then and one per list that completes afterwards. On
// a terminal the waiting line is redrawn as pages arrive, counting them and the objects read, and
// cleared when the listing ends; into a file or pipe only whole lines go.
type progress struct {
	w     io.Writer
	tty   bool
	start time.Time
	now   func() time.Time

	mu      sync.Mutex
	shown   bool
	drawn   bool // a line without its newline is on the terminal
	pending []string
	read    map[string]*pageCount
	timer   *time.Timer
}

type pageCount struct{ pages, objects int }

// newProgress starts the clock; after delay (progressDelay outside tests) it reports.
func newProgress(w io.Writer, delay time.Duration) *progress {
	p := &progress{w: w, tty: isTerminal(w), start: time.Now(), now: time.Now, read: map[string]*pageCount{}}
	p.timer = time.AfterFunc(delay, p.show)
	return p
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// begin registers a list that is about to be requested.
func (p *progress) begin(what string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending = append(p.pending, what)
	p.read[what] = &pageCount{}
}

// page records that a page of n objects of a pending list arrived.
func (p *progress) page(what string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.read[what]
	if c == nil {
		return
	}
	c.pages++
	c.objects += n
	if p.shown && p.tty {
		p.draw()
	}
}

// restart says that a list starts over (its continue token expired between pages): always, since
// it costs the user a second listing.
func (p *progress) restart(what string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLine()
	fmt.Fprintf(p.w, "kubectl dra: listing %s again: the list changed too much between two pages (%v)\n", what, err)
	if c := p.read[what]; c != nil {
		*c = pageCount{}
	}
}

// done records that a list arrived with n objects.
func (p *progress) done(what string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i := slices.Index(p.pending, what); i >= 0 {
		p.pending = slices.Delete(p.pending, i, i+1)
	}
	if !p.shown {
		return
	}
	p.clearLine()
	pages := ""
	if c := p.read[what]; c != nil && c.pages > 1 {
		pages = fmt.Sprintf(" in %d pages", c.pages)
	}
	fmt.Fprintf(p.w, "kubectl dra: %d %s listed%s (%s)\n", n, what, pages, p.elapsed())
	if p.tty {
		p.draw()
	}
}

func (p *progress) show() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pending) == 0 {
		return
	}
	p.shown = true
	if p.tty {
		p.draw()
		return
	}
	fmt.Fprintf(p.w, "kubectl dra: listing %s (%s)...\n", strings.Join(p.pending, ", "), p.elapsed())
}

// draw (p.mu held) rewrites the terminal's last line with what is pending and how far each got.
func (p *progress) draw() {
	if len(p.pending) == 0 {
		p.clearLine()
		return
	}
	parts := make([]string, 0, len(p.pending))
	for _, what := range p.pending {
		c := p.read[what]
		if c.pages == 0 {
			parts = append(parts, what)
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %d (%d pages)", what, c.objects, c.pages))
	}
	fmt.Fprintf(p.w, "\r\033[Kkubectl dra: listing %s (%s)...", strings.Join(parts, ", "), p.elapsed())
	p.drawn = true
}

// clearLine (p.mu held) removes the line draw left, so that the next output starts clean.
func (p *progress) clearLine() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}

// stop ends the reports; later completions print nothing.
func (p *progress) stop() {
	p.timer.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLine()
	p.shown = false
}

func (p *progress) elapsed() string {
	return p.now().Sub(p.start).Round(100 * time.Millisecond).String()
}
