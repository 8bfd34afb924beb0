package answers

import (
	"context"
	"sync"
	"testing"
	"time"
)

// hangGuard only tells a blocked call from a slow one.
const hangGuard = time.Minute

func key(b byte) *Key { return &Key{b} }

// TestFindOnce: reviews asking the same question while it is searched share one search and its
// answer, which is then remembered.
func TestFindOnce(t *testing.T) {
	c := New(8)
	release := make(chan struct{})
	find := func(context.Context) (string, bool) {
		<-release
		return "no GPU", true
	}
	const callers = 64
	var started, wg sync.WaitGroup
	answers := make([]string, callers)
	for i := range callers {
		started.Add(1)
		wg.Go(func() {
			started.Done()
			a, ok := c.Find(t.Context(), key(1), hangGuard, find)
			if !ok {
				t.Errorf("caller %d: no answer", i)
			}
			answers[i] = a
		})
	}
	started.Wait()
	// Every caller has at least started; those that reach Find after the search ended get the
	// remembered answer, which is as good a proof.
	close(release)
	wg.Wait()
	for i, a := range answers {
		if a != "no GPU" {
			t.Errorf("caller %d: %q", i, a)
		}
	}
	if n := c.Searches(); n != 1 {
		t.Errorf("%d searches for %d callers of one question, want 1", n, callers)
	}
	if a, ok := c.Get(*key(1)); !ok || a != "no GPU" {
		t.Errorf("remembered %q, %t", a, ok)
	}
}

// TestFindCases: what is remembered, and what a caller that gives up gets.
func TestFindCases(t *testing.T) {
	for _, tc := range []struct {
		name string
		// find is the search; callerTimeout the caller's own deadline (0: none).
		find          func(ctx context.Context) (string, bool)
		searchTimeout time.Duration
		callerTimeout time.Duration
		wantAnswer    string
		wantOK        bool
		wantKept      bool
	}{
		{"kept", func(context.Context) (string, bool) { return "held", true }, hangGuard, 0, "held", true, true},
		{"empty answer kept", func(context.Context) (string, bool) { return "", true }, hangGuard, 0, "", true, true},
		{"not to keep", func(context.Context) (string, bool) { return "error", false }, hangGuard, 0, "error", true, false},
		{"interrupted", func(ctx context.Context) (string, bool) { <-ctx.Done(); return "", true }, time.Millisecond, 0, "", true, false},
		{"caller gives up", func(ctx context.Context) (string, bool) { time.Sleep(50 * time.Millisecond); return "late", true }, hangGuard, time.Millisecond, "", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(8)
			ctx := t.Context()
			if tc.callerTimeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.callerTimeout)
				defer cancel()
			}
			a, ok := c.Find(ctx, key(1), tc.searchTimeout, tc.find)
			if a != tc.wantAnswer || ok != tc.wantOK {
				t.Errorf("Find: %q, %t; want %q, %t", a, ok, tc.wantAnswer, tc.wantOK)
			}
			// The search goes on without the caller: wait for it to leave.
			deadline := time.Now().Add(hangGuard)
			for c.pendingCount() > 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if _, kept := c.Get(*key(1)); kept != tc.wantKept {
				t.Errorf("remembered: %t, want %t", kept, tc.wantKept)
			}
			// A question remembered is not searched again; one not remembered is.
			_, _ = c.Find(t.Context(), key(1), hangGuard, func(context.Context) (string, bool) { return "again", true })
			want := int64(2)
			if tc.wantKept {
				want = 1
			}
			if n := c.Searches(); n != want {
				t.Errorf("%d searches after asking twice, want %d", n, want)
			}
		})
	}
}

// TestFindQuestionsApart: searches of different questions run at the same time, and the search
// keeps the caller's values but not its end.
func TestFindQuestionsApart(t *testing.T) {
	c := New(8)
	type ctxKey struct{}
	ctx, cancel := context.WithCancel(context.WithValue(t.Context(), ctxKey{}, "logger"))
	var both sync.WaitGroup
	both.Add(2)
	find := func(ctx context.Context) (string, bool) {
		both.Done()
		both.Wait() // returns once both searches run
		if ctx.Value(ctxKey{}) != "logger" {
			return "values lost", true
		}
		if ctx.Err() != nil {
			return "ended with the caller", true
		}
		return "ok", true
	}
	results := make(chan string, 2)
	for _, k := range []*Key{key(1), key(2)} {
		go func() {
			a, _ := c.Find(ctx, k, hangGuard, find)
			results <- a
		}()
	}
	for range 2 {
		select {
		case a := <-results:
			if a != "ok" {
				t.Errorf("answer %q", a)
			}
		case <-time.After(hangGuard):
			t.Fatal("two questions were not searched at the same time")
		}
	}
	cancel()
	_, _ = c.Find(ctx, key(3), hangGuard, func(ctx context.Context) (string, bool) { return "", true })
	deadline := time.Now().Add(hangGuard)
	for c.pendingCount() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if a, ok := c.Get(*key(3)); !ok || a != "" {
		t.Errorf("a search started by a caller already gone: %q, %t; want it run and remembered", a, ok)
	}
}

// pendingCount is how many searches are under way.
func (c *Cache) pendingCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// TestFindSharedBounded: with maxShared questions searched apart from their callers, a caller
// asking another one searches it in its own time, and ends it when it leaves.
func TestFindSharedBounded(t *testing.T) {
	c := New(maxShared + 8)
	release := make(chan struct{})
	defer close(release)
	blocked := func(context.Context) (string, bool) { <-release; return "", true }
	for i := range maxShared {
		ctx, cancel := context.WithCancel(t.Context())
		cancel() // gone at once: the search stays
		_, _ = c.Find(ctx, &Key{byte(i), 1}, hangGuard, blocked)
	}
	if n := c.pendingCount(); n != maxShared {
		t.Fatalf("%d searches under way, want %d", n, maxShared)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	var ended bool
	a, ok := c.Find(ctx, &Key{0, 2}, hangGuard, func(ctx context.Context) (string, bool) {
		<-ctx.Done() // the caller's end, not hangGuard's
		ended = true
		return "", true
	})
	if !ended || a != "" || !ok {
		t.Errorf("past the bound: %q, %t, search ended with its caller: %t", a, ok, ended)
	}
	if n := c.pendingCount(); n != maxShared {
		t.Errorf("%d searches under way after one past the bound, want %d", n, maxShared)
	}
	if _, kept := c.Get(Key{0, 2}); kept {
		t.Error("an interrupted search past the bound was remembered")
	}
}

// TestFindWithoutKey: a question without a key is searched in the caller's time at each ask, and
// nothing is remembered or counted as a shared search.
func TestFindWithoutKey(t *testing.T) {
	c := New(8)
	asked := 0
	for range 2 {
		a, ok := c.Find(t.Context(), nil, hangGuard, func(context.Context) (string, bool) { asked++; return "held", true })
		if a != "held" || !ok {
			t.Errorf("Find: %q, %t", a, ok)
		}
	}
	if asked != 2 || c.Searches() != 0 || c.found.Len() != 0 {
		t.Errorf("searched %d times for 2 asks (want 2), %d shared searches (want 0), %d remembered (want 0)", asked, c.Searches(), c.found.Len())
	}
}
