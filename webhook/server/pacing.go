package server

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

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

// maxWaitingForTurn bounds the connections a pacedListener takes from the listen queue before
// their turn (one file descriptor each): beyond it, dials wait in the listen queue, first come,
// first served, as the kernel serves them.
const maxWaitingForTurn = 1024

// waiter is what a pacedListener takes from a rate.Limiter.
type waiter interface {
	Wait(ctx context.Context) error
}

// pacedListener lets a connection through to its TLS handshake only when the limiter allows,
// the clients' connections in turns, and drops connections whose client gave up while they
// waited.
//
// The connection bound (netutil.LimitListener) caps the connections open, not how often they
// are replaced: while reviews queue, the API server keeps dialing (one dial for every review that
// finds no idle connection), and each connection it then closes, having more than 25 idle, lets
// one of the dials waiting in the listen queue in. Unpaced, every one of those dials cost a
// handshake, thousands after a burst, and they kept the webhook saturated long after the burst
// ended. Paced, the dials wait; the API server gives up on those it no longer needs after its TLS
// handshake timeout (10 s), and those cost nothing (peerGone).
//
// The dials wait in turns (turns), not in the listen queue, which serves them in the order
// they came: there the dials of one API server whose reviews queued held every other API
// server's new connections behind them for as long as the pace took to work through them.
type pacedListener struct {
	net.Listener
	limiter    waiter
	maxWaiting int
	// closed ends the waits: the server is shutting down.
	closed    context.Context
	close     context.CancelFunc
	closeOnce sync.Once

	mu      sync.Mutex
	waiting *turns
	// err is the listen queue's last error, for the next Accept; net.ErrClosed stays.
	err error
	// arrived is signalled when a connection or an error is added; room when a connection left.
	arrived, room chan struct{}
}

func newPacedListener(l net.Listener, perSecond int) *pacedListener {
	return newPacedListenerWith(l, rate.NewLimiter(rate.Limit(perSecond), perSecond), maxWaitingForTurn)
}

// newPacedListenerWith starts taking l's connections, at most maxWaiting waiting for their turn at
// once, until Close.
func newPacedListenerWith(l net.Listener, w waiter, maxWaiting int) *pacedListener {
	ctx, cancel := context.WithCancel(context.Background())
	pl := &pacedListener{Listener: l, limiter: w, maxWaiting: maxWaiting, closed: ctx, close: cancel,
		waiting: newTurns(), arrived: make(chan struct{}, 1), room: make(chan struct{}, 1)}
	go pl.take()
	return pl
}

// signal wakes the one waiting on ch, if any, or the next to wait.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Accept returns the next connection, in turn, whose client is still there, once the limiter
// allows one.
func (l *pacedListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.next()
		if err != nil {
			return nil, err
		}
		if err := l.limiter.Wait(l.closed); err != nil {
			conn.Close()
			return nil, net.ErrClosed
		}
		// Its client may have left while it waited for the limiter.
		if peerGone(conn) {
			conn.Close()
			continue
		}
		return conn, nil
	}
}

// next takes the connection whose turn it is, dropping those whose client left: a dial that
// waited past the client's handshake timeout does not take a turn. It waits for one, or returns
// the listen queue's error.
func (l *pacedListener) next() (net.Conn, error) {
	for {
		l.mu.Lock()
		if err := l.err; err != nil {
			if !errors.Is(err, net.ErrClosed) {
				l.err = nil
			}
			l.mu.Unlock()
			return nil, err
		}
		conn := l.waiting.pop()
		more := l.waiting.n > 0
		l.mu.Unlock()
		if more {
			// For another Accept waiting meanwhile (the server calls it from one goroutine).
			signal(l.arrived)
		}
		if conn != nil {
			signal(l.room)
			if peerGone(conn) {
				conn.Close()
				continue
			}
			return conn, nil
		}
		select {
		case <-l.arrived:
		case <-l.closed.Done():
			return nil, net.ErrClosed
		}
	}
}

// take moves the listen queue's connections into the turns, as long as there is room, until the
// listener is closed. An error is handed to the next Accept (the server retries a temporary one),
// and taking goes on after a pause.
func (l *pacedListener) take() {
	var pause time.Duration
	for l.roomForOne() {
		conn, err := l.Listener.Accept()
		l.mu.Lock()
		switch {
		case err == nil && l.closed.Err() == nil:
			l.waiting.push(conn)
			pause = 0
		case err == nil:
			conn.Close()
		case errors.Is(err, net.ErrClosed) || l.closed.Err() != nil:
			l.err = net.ErrClosed
		default:
			l.err = err
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
		}
		stop := errors.Is(l.err, net.ErrClosed)
		l.mu.Unlock()
		signal(l.arrived)
		if stop {
			return
		}
		if err != nil {
			select {
			case <-time.After(pause):
			case <-l.closed.Done():
			}
		}
	}
}

// roomForOne waits until fewer than maxWaiting connections wait; false once the listener is closed.
func (l *pacedListener) roomForOne() bool {
	for {
		l.mu.Lock()
		full := l.waiting.n >= l.maxWaiting
		l.mu.Unlock()
		if !full {
			return true
		}
		select {
		case <-l.room:
		case <-l.closed.Done():
			return false
		}
	}
}

// waitingForTurn is how many connections wait for their turn.
func (l *pacedListener) waitingForTurn() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting.n
}

// Close stops the waits and the listener, and closes the connections waiting for their turn.
func (l *pacedListener) Close() error {
	l.closeOnce.Do(l.close)
	err := l.Listener.Close()
	l.mu.Lock()
	l.waiting.closeAll()
	l.mu.Unlock()
	return err
}
