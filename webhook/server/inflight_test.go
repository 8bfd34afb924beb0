package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

// blocking is a handler that counts the requests in it and holds each until release is closed.
type blocking struct {
	in, most atomic.Int32
	entered  chan struct{}
	release  chan struct{}
}

func (b *blocking) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	n := b.in.Add(1)
	for m := b.most.Load(); n > m && !b.most.CompareAndSwap(m, n); m = b.most.Load() {
	}
	b.entered <- struct{}{}
	<-b.release
	b.in.Add(-1)
	w.WriteHeader(http.StatusOK)
}

// TestLimitInFlight: of more requests than there are places, as many as there are places are
// handled at once, the others once a place is free, every one answered; and a request that ends
// while it waits leaves without being handled.
func TestLimitInFlight(t *testing.T) {
	const places, requests = 2, 5
	b := &blocking{entered: make(chan struct{}, requests+1), release: make(chan struct{})}
	arrived := make(chan struct{}, requests)
	limited := limitInFlight(b, places)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		limited.ServeHTTP(w, r)
	})
	codes := make([]int, requests)
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/validate", nil))
			codes[i] = rec.Code
		})
	}
	for range requests {
		<-arrived
	}
	for range places {
		<-b.entered
	}
	// Every request has arrived and the places are taken: the others wait. One more, whose
	// request has ended, is turned away without being handled.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ended := make(chan int)
	go func() {
		rec := httptest.NewRecorder()
		limited.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/validate", nil).WithContext(ctx))
		ended <- rec.Code
	}()
	select {
	case code := <-ended:
		if code != http.StatusServiceUnavailable {
			t.Errorf("a request that ended while waiting got %d, want %d", code, http.StatusServiceUnavailable)
		}
	case <-b.entered:
		t.Error("a request that ended while waiting was handled")
	}
	close(b.release)
	wg.Wait()
	if most := b.most.Load(); most != places {
		t.Errorf("%d requests were handled at once, want %d", most, places)
	}
	for i, code := range codes {
		if code != http.StatusOK {
			t.Errorf("request %d: %d, want %d", i, code, http.StatusOK)
		}
	}
}
