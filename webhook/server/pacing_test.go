package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gate is a waiter that lets one Wait through for each token sent, and counts the Waits.
type gate struct {
	tokens chan struct{}
	waits  atomic.Int32
	// waiting is sent to as a Wait begins.
	waiting chan struct{}
}

func newGate() *gate { return &gate{tokens: make(chan struct{}), waiting: make(chan struct{}, 8)} }

func (g *gate) Wait(ctx context.Context) error {
	g.waits.Add(1)
	g.waiting <- struct{}{}
	select {
	case <-g.tokens:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// recording is a listener that keeps the connections it accepted and, for those the test says
// their client closed, returns them only once peerGone sees it: the test knows the close reached
// the server before the pacing looked. Accept runs outside the test's goroutine, so it reports a
// close that never arrives as an error, not through t.
type recording struct {
	net.Listener
	mu       sync.Mutex
	closed   []bool // the next connections' clients closed them, in order
	accepted []net.Conn
}

func (l *recording) expect(closed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = append(l.closed, closed)
}

func (l *recording) last() net.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.accepted[len(l.accepted)-1]
}

func (l *recording) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	closed := len(l.closed) > 0 && l.closed[0]
	if len(l.closed) > 0 {
		l.closed = l.closed[1:]
	}
	l.accepted = append(l.accepted, conn)
	l.mu.Unlock()
	for deadline := time.Now().Add(10 * time.Second); closed && !peerGone(conn); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			conn.Close()
			return nil, fmt.Errorf("the close of the connection from %s did not reach the server within 10 s", conn.RemoteAddr())
		}
	}
	return conn, nil
}

// within is what ch sends next, or a fatal error naming what did not happen within 10 s.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("waited 10 s for %s", what)
		panic("unreachable")
	}
}

// needPeerGone skips a test of what only Linux's TCP_INFO tells: elsewhere peerGone is always
// false and every connection takes its turn. CI runs on Linux.
func needPeerGone(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skipf("peerGone reads TCP_INFO, which %s does not have", runtime.GOOS)
	}
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestPeerGone: a connection is gone once its client closed it, with its ClientHello (here a
// few bytes) still unread, and not while the client holds it.
func TestPeerGone(t *testing.T) {
	needPeerGone(t)
	l := listenLoopback(t)
	client := dial(t, l.Addr().String())
	server, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if _, err := client.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if peerGone(server) {
		t.Fatal("a connection whose client holds it is gone")
	}
	client.Close()
	waitFor(t, "the connection to be gone after its client closed it", func() bool { return peerGone(server) })
}

// TestPacedListener: a connection is returned only once the limiter lets it through; one whose
// client closed it before its turn is dropped without taking one, one whose client closed it
// while it waited is dropped after; and Close ends a wait.
func TestPacedListener(t *testing.T) {
	needPeerGone(t)
	inner := &recording{Listener: listenLoopback(t)}
	g := newGate()
	l := newPacedListenerWith(inner, g, maxWaitingForTurn)
	addr := inner.Addr().String()
	type accepted struct {
		conn net.Conn
		err  error
	}
	results := make(chan accepted, 1)
	accept := func() {
		conn, err := l.Accept()
		results <- accepted{conn, err}
	}
	returned := func(want net.Conn) {
		t.Helper()
		r := within(t, results, "Accept to return")
		if r.err != nil {
			t.Fatalf("Accept: %v", r.err)
		}
		defer r.conn.Close()
		if r.conn.RemoteAddr().String() != want.LocalAddr().String() {
			t.Errorf("Accept returned the connection from %s, want the one from %s", r.conn.RemoteAddr(), want.LocalAddr())
		}
	}

	// Closed before its turn: dropped without one; the next takes a turn and is returned.
	inner.expect(true)
	dial(t, addr).Close()
	inner.expect(false)
	held := dial(t, addr)
	go accept()
	within(t, g.waiting, "a wait for a turn")
	select {
	case r := <-results:
		t.Fatalf("Accept returned %v, %v before its turn", r.conn, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	g.tokens <- struct{}{}
	returned(held)
	if n := g.waits.Load(); n != 1 {
		t.Errorf("%d turns taken, want 1: the connection closed before its turn took one", n)
	}

	// Closed while it waited for its turn: dropped after it.
	inner.expect(false)
	leaving := dial(t, addr)
	go accept()
	within(t, g.waiting, "a wait for a turn")
	leaving.Close()
	waitFor(t, "the client's close to reach the server", func() bool { return peerGone(inner.last()) })
	inner.expect(false)
	staying := dial(t, addr)
	g.tokens <- struct{}{}
	within(t, g.waiting, "a wait for a turn")
	g.tokens <- struct{}{}
	returned(staying)

	// Close while a connection waits for its turn.
	inner.expect(false)
	dial(t, addr)
	go accept()
	within(t, g.waiting, "a wait for a turn")
	l.Close()
	if r := within(t, results, "Accept to return"); !errors.Is(r.err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, %v; want net.ErrClosed", r.conn, r.err)
	}
}

// startPacedServer starts the webhook server with its handshakes paced at perSecond, and returns
// its address.
func startPacedServer(t *testing.T, perSecond int) string {
	t.Helper()
	dir := t.TempDir()
	writeCert(t, dir, 1)
	o := NewOptions()
	o.CertDir = dir
	o.MaxHandshakesPerSecond = perSecond
	return startWebhookServer(t, o, &blocking{entered: make(chan struct{}, 1), release: make(chan struct{})})
}

// TestHandshakesPaced: the webhook server makes no more TLS handshakes than
// --max-handshakes-per-second allows (as many at once, then one every 1/rate s), and every
// connection gets its handshake. Unpaced, the handshakes took milliseconds in all.
func TestHandshakesPaced(t *testing.T) {
	const perSecond, conns = 4, 8
	addr := startPacedServer(t, perSecond)

	start := time.Now()
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test does not authenticate the server
			if err != nil {
				t.Errorf("connection %d: %v", i, err)
				return
			}
			conn.Close()
		})
	}
	wg.Wait()
	// However full the bucket was, the last (conns - perSecond) handshakes came 1/perSecond apart.
	least := time.Duration(conns-perSecond) * time.Second / perSecond
	if took := time.Since(start); took < least-least/10 {
		t.Errorf("%d handshakes took %s, want at least %s at %d a second", conns, took, least, perSecond)
	}
}

// failingOnce is a listener whose first Accept fails with err.
type failingOnce struct {
	net.Listener
	err  error
	once sync.Once
}

func (f *failingOnce) Accept() (net.Conn, error) {
	var err error
	f.once.Do(func() { err = f.err })
	if err != nil {
		return nil, err
	}
	return f.Listener.Accept()
}

// TestPacedListenerHandsOnErrors: an error of the listen queue (out of file descriptors) is the
// next Accept's, which the server retries, and taking connections goes on after it; after Close,
// Accept fails with net.ErrClosed.
func TestPacedListenerHandsOnErrors(t *testing.T) {
	inner := listenLoopback(t)
	g := newGate()
	full := errors.New("accept: too many open files")
	l := newPacedListenerWith(&failingOnce{Listener: inner, err: full}, g, maxWaitingForTurn)
	t.Cleanup(func() { l.Close() })
	if conn, err := l.Accept(); !errors.Is(err, full) {
		t.Fatalf("Accept: %v, %v; want the listen queue's error", conn, err)
	}
	client := dial(t, inner.Addr().String())
	conn := acceptOnTurn(t, l, g)
	if conn.RemoteAddr().String() != client.LocalAddr().String() {
		t.Errorf("Accept returned the connection from %s, want the one from %s", conn.RemoteAddr(), client.LocalAddr())
	}
	conn.Close()
	l.Close()
	if conn, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, %v; want net.ErrClosed", conn, err)
	}
}
