// Package answers remembers the answers to questions about one state of the cluster, and finds
// each at most once at a time: the reviews asking the same question while it is being answered
// wait for that one search instead of each running its own.
//
// Without that, a question nobody asked since the state changed (the first reviews after a
// start, a new published state, a new fleet of current allocations) is searched by every review
// that arrives before the first search ends. At a thousand reviews a second a search of tens of
// milliseconds is then run tens of times at once; on a busy machine each takes longer, more
// reviews arrive meanwhile, the searches run past their deadline and so are never remembered,
// and the webhook stays saturated for as long as the load lasts.
package answers

import (
	"context"
	"crypto/sha256"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/lru"
)

// Key is a question's digest (feasibility.QuestionKey).
type Key = [sha256.Size]byte

// Cache holds the answers found for one state, at most size of them (least recently used
// dropped first), and the searches under way. It is safe for concurrent use.
type Cache struct {
	found *lru.Cache
	// searches counts the searches started.
	searches atomic.Int64

	mu      sync.Mutex
	pending map[Key]*search
}

// search is one search under way; answer and ok are set before done is closed.
type search struct {
	done   chan struct{}
	answer string
	ok     bool
}

// New is an empty cache of at most size answers.
func New(size int) *Cache {
	return &Cache{found: lru.New(size), pending: map[Key]*search{}}
}

// Get is the answer remembered for key.
func (c *Cache) Get(key Key) (string, bool) {
	if a, ok := c.found.Get(key); ok {
		return a.(string), true
	}
	return "", false
}

// Searches is how many searches have started: one a question asked while it was not remembered
// and no search of it was under way.
func (c *Cache) Searches() int64 { return c.searches.Load() }

// Find is the answer to key: the one remembered, else the one find gives. find runs once for
// every caller asking meanwhile, in a goroutine of its own, under a context that keeps ctx's
// values (its logger) but not its end, and ends after timeout: a caller that gives up does not
// end the search the others wait for. Its answer is remembered when find says it may be (keep)
// and its context had not ended: an interrupted search proves nothing. ok is false when ctx ended
// before the answer came; the answer is then "".
//
// At most maxShared questions are searched so at a time; beyond them, and for a question without
// a key (nil: one that cannot be digested), a caller searches in its own time, as if nobody else
// asked. find must not modify what it shares with its caller, which may have returned when it runs.
func (c *Cache) Find(ctx context.Context, key *Key, timeout time.Duration, find func(ctx context.Context) (answer string, keep bool)) (string, bool) {
	var s *search
	if key != nil {
		if a, ok := c.Get(*key); ok {
			return a, true
		}
		s = c.start(ctx, *key, timeout, find)
	}
	if s == nil {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		answer, keep := find(ctx)
		if key != nil && keep && ctx.Err() == nil {
			c.found.Add(*key, answer)
		}
		return answer, true
	}
	select {
	case <-s.done:
		return s.answer, s.ok
	case <-ctx.Done():
		return "", false
	}
}

// maxShared bounds the searches run apart from their callers, each of another question: a
// caller that leaves does not end them, so without a bound a client asking many questions and
// hanging up could leave more searches running than it keeps requests open.
const maxShared = 64

// start returns the search for key under way, starting it when there is none; nil when maxShared
// searches are under way.
func (c *Cache) start(ctx context.Context, key Key, timeout time.Duration, find func(ctx context.Context) (string, bool)) *search {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.pending[key]; ok {
		return s
	}
	// Found between the caller's Get and now, by a search that ended meanwhile.
	if a, ok := c.Get(key); ok {
		s := &search{done: make(chan struct{}), answer: a, ok: true}
		close(s.done)
		return s
	}
	if len(c.pending) >= maxShared {
		return nil
	}
	s := &search{done: make(chan struct{})}
	c.pending[key] = s
	c.searches.Add(1)
	go c.run(context.WithoutCancel(ctx), key, timeout, find, s)
	return s
}

func (c *Cache) run(ctx context.Context, key Key, timeout time.Duration, find func(ctx context.Context) (string, bool), s *search) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	answer, keep := find(ctx)
	s.answer, s.ok = answer, true
	c.mu.Lock()
	// Remembered before the search leaves pending: a caller arriving now finds one or the other.
	if keep && ctx.Err() == nil {
		c.found.Add(key, answer)
	}
	delete(c.pending, key)
	c.mu.Unlock()
	close(s.done)
}
