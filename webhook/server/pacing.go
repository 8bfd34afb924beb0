package server

import (
	"context"
	"net"
	"sync"

	"golang.org/x/time/rate"
)

// DefaultHandshakesPerSecond is --max-handshakes-per-second's default: a TLS handshake is a
// millisecond or more of the webhook's CPU, so 50 a second take at most a few percent of it,
// while the burst of as many lets several API servers open their connections to a new replica
// at once.
const DefaultHandshakesPerSecond = 50

// maxHandshakesPerSecond caps --max-handshakes-per-second: about what the chart's 2 CPUs can
// handshake at all.
const maxHandshakesPerSecond = 10000

// waiter is what a pacedListener takes from a rate.Limiter.
type waiter interface {
	Wait(ctx context.Context) error
}

// pacedListener lets a connection through to its TLS handshake only when the limiter allows,
// and drops connections whose client gave up while they waited.
//
// The connection bound (netutil.LimitListener) caps the connections open, not how often they
// are replaced: while reviews queue, the API server keeps dialing (one dial for every review that
// finds no idle connection), and each connection it then closes, having more than 25 idle, lets
// one of the dials waiting in the listen queue in. Unpaced, every one of those dials cost a
// handshake, thousands after a burst, and they kept the webhook saturated long after the burst
// ended. Paced, the dials wait in the listen queue; the API server gives up on those it no
// longer needs after its TLS handshake timeout (10 s), and those cost nothing (peerGone).
type pacedListener struct {
	net.Listener
	limiter waiter
	// closed ends a wait for the limiter: the server is shutting down.
	closed    context.Context
	close     context.CancelFunc
	closeOnce sync.Once
}

func newPacedListener(l net.Listener, perSecond int) *pacedListener {
	return newPacedListenerWith(l, rate.NewLimiter(rate.Limit(perSecond), perSecond))
}

func newPacedListenerWith(l net.Listener, w waiter) *pacedListener {
	ctx, cancel := context.WithCancel(context.Background())
	return &pacedListener{Listener: l, limiter: w, closed: ctx, close: cancel}
}

// Accept returns the next connection whose client is still there, once the limiter allows one.
func (l *pacedListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		// A dial that waited in the listen queue past the client's handshake timeout does not
		// take a turn.
		if peerGone(conn) {
			conn.Close()
			continue
		}
		if err := l.limiter.Wait(l.closed); err != nil {
			conn.Close()
			return nil, net.ErrClosed
		}
		if peerGone(conn) {
			conn.Close()
			continue
		}
		return conn, nil
	}
}

// Close stops a wait for the limiter as well as the listener.
func (l *pacedListener) Close() error {
	l.closeOnce.Do(l.close)
	return l.Listener.Close()
}
