package server

import (
	"net/http"
)

// DefaultMaxRequestsInFlight is --max-requests-in-flight's default: on the chart's 2 CPUs a
// review is a fraction of a millisecond of CPU, so 64 running at once keep both busy while the
// few that wait on the API server (pod injection creating a template) do.
const DefaultMaxRequestsInFlight = 64

// maxMaxRequestsInFlight caps --max-requests-in-flight: more at once than a replica has CPUs for
// by two orders of magnitude only lets a burst grow the heap again, which the limit is for.
const maxMaxRequestsInFlight = 4096

// idleRoom is how many connections past --max-requests-in-flight the webhook server keeps open
// unless --max-connections says otherwise: the idle connections of several API servers (client-go
// keeps 25 to a webhook), and no more. Each connection beyond would be a TLS handshake, a
// millisecond or more of CPU: when reviews queue, the API server dials a connection for every
// review that finds none idle, and unbounded, the handshakes took half the webhook's CPU and kept
// the backlog from draining.
const idleRoom = 192

// maxMaxConnections caps --max-connections: a descriptor and a goroutine each.
const maxMaxConnections = 65536

// limitInFlight admits at most n requests into next at once; the others wait for a place, each
// as long as its request lasts (the API server gives up on the webhook after timeoutSeconds and
// closes the connection). A review in progress holds the review decoded, the checks' state and
// its answer, tens of kilobytes; one waiting holds only its connection, its body still unread.
// The API server calls webhooks with as many requests at once as it serves (hundreds): without
// the limit, a burst holds them all in progress, and the heap grows with it.
func limitInFlight(next http.Handler, n int) http.Handler {
	places := make(chan struct{}, n)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case places <- struct{}{}:
		case <-r.Context().Done():
			http.Error(w, "the webhook had no room for the request before it ended", http.StatusServiceUnavailable)
			return
		}
		defer func() { <-places }()
		next.ServeHTTP(w, r)
	})
}
