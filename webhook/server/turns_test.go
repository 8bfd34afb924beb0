package server

import (
	"crypto/tls"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fromPeer is a connection, named id for TestTurns, that only tells its client's address; the
// rest of net.Conn is never called.
type fromPeer struct {
	net.Conn
	id   string
	addr net.Addr
}

func (c fromPeer) RemoteAddr() net.Addr { return c.addr }
func (c fromPeer) Close() error         { return nil }

// TestTurns: connections are handed out a client at a time, in the order the clients first had
// one waiting, each client's oldest first; a client whose last connection left gives its turn to
// the next, and joins the round again behind the others when it dials again.
func TestTurns(t *testing.T) {
	for _, tc := range []struct {
		name string
		// ops: a client's letter pushes a connection of it (numbered in order), "-" pops one.
		ops  []string
		want []string
	}{
		{"one client", []string{"a", "a", "a", "-", "-", "-", "-"}, []string{"a1", "a2", "a3", ""}},
		{"a burst, then another client", []string{"a", "a", "a", "a", "b", "-", "-", "-", "-", "-"}, []string{"a1", "b1", "a2", "a3", "a4"}},
		{"three clients", []string{"a", "a", "a", "b", "c", "a", "b", "-", "-", "-", "-", "-", "-", "-"}, []string{"a1", "b1", "c1", "a2", "b2", "a3", "a4"}},
		{"a client leaves and dials again", []string{"a", "b", "b", "-", "-", "a", "-", "-"}, []string{"a1", "b1", "a2", "b2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := newTurns()
			counts := map[string]int{}
			var got []string
			for _, op := range tc.ops {
				if op != "-" {
					counts[op]++
					id := op + string(rune('0'+counts[op]))
					q.push(fromPeer{id: id, addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, byte(op[0])), Port: 1000 + counts[op]}})
					continue
				}
				conn := q.pop()
				if conn == nil {
					got = append(got, "")
					continue
				}
				got = append(got, conn.(fromPeer).id)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("handed out %v, want %v", got, tc.want)
			}
			if q.n != 0 || len(q.ring) != 0 || len(q.byPeer) != 0 {
				t.Errorf("after every connection left: %d waiting, ring %v, %d clients kept", q.n, q.ring, len(q.byPeer))
			}
		})
	}
}

// dialFrom dials addr from the loopback address ip (Linux routes all of 127.0.0.0/8 to lo).
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, ip, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// acceptOnTurn is the connection l's Accept returns once g gave it its turn.
func acceptOnTurn(t *testing.T, l *pacedListener, g *gate) net.Conn {
	t.Helper()
	type accepted struct {
		conn net.Conn
		err  error
	}
	result := make(chan accepted, 1)
	go func() {
		conn, err := l.Accept()
		result <- accepted{conn, err}
	}()
	within(t, g.waiting, "a wait for a turn")
	g.tokens <- struct{}{}
	r := within(t, result, "Accept to return")
	if r.err != nil {
		t.Fatalf("Accept: %v", r.err)
	}
	return r.conn
}

// TestPacedListenerTurnsByPeer: a client's one dial, made after another client's burst of dials,
// is let through on the second turn, not after the burst (the listen queue served it 21st), and
// the turns go back to the burst after it.
func TestPacedListenerTurnsByPeer(t *testing.T) {
	needPeerGone(t) // Linux: its loopback takes every 127/8 address
	inner := listenLoopback(t)
	g := newGate()
	const burst = 20
	l := newPacedListenerWith(inner, g, 2*burst)
	t.Cleanup(func() { l.Close() })
	addr := inner.Addr().String()
	for range burst {
		dialFrom(t, "127.0.0.1", addr)
	}
	other := dialFrom(t, "127.0.0.2", addr)
	waitFor(t, "every dial to wait for its turn", func() bool { return l.waitingForTurn() == burst+1 })

	var order []string
	for range 3 {
		conn := acceptOnTurn(t, l, g)
		defer conn.Close()
		order = append(order, peerOf(conn))
		if peerOf(conn) == "127.0.0.2" && conn.RemoteAddr().String() != other.LocalAddr().String() {
			t.Errorf("the other client's connection is from %s, want %s", conn.RemoteAddr(), other.LocalAddr())
		}
	}
	if want := []string{"127.0.0.1", "127.0.0.2", "127.0.0.1"}; !slices.Equal(order, want) {
		t.Errorf("turns went to %s, want %s", strings.Join(order, ", "), strings.Join(want, ", "))
	}
}

// TestPacedListenerTakesAtMostMaxWaiting: beyond maxWaiting connections waiting for their turn,
// dials stay in the listen queue; each turn taken lets one more in.
func TestPacedListenerTakesAtMostMaxWaiting(t *testing.T) {
	inner := listenLoopback(t)
	g := newGate()
	const maxWaiting, dials = 4, 6
	l := newPacedListenerWith(inner, g, maxWaiting)
	t.Cleanup(func() { l.Close() })
	for range dials {
		dial(t, inner.Addr().String())
	}
	waitFor(t, "the dials to wait for their turns", func() bool { return l.waitingForTurn() == maxWaiting })
	time.Sleep(100 * time.Millisecond)
	if n := l.waitingForTurn(); n != maxWaiting {
		t.Fatalf("%d connections wait for their turn, want at most %d", n, maxWaiting)
	}
	acceptOnTurn(t, l, g).Close()
	waitFor(t, "one more dial to be taken", func() bool { return l.waitingForTurn() == maxWaiting })
}

// TestHandshakesTakeTurnsByClient: through the webhook server, a client's one TLS connection,
// dialed after another client's burst of dials, has its handshake on the next turn or the one
// after, not after the burst's (at 4 handshakes a second, 3 s later).
func TestHandshakesTakeTurnsByClient(t *testing.T) {
	needPeerGone(t) // Linux: its loopback takes every 127/8 address
	const perSecond, burst = 4, 16
	addr := startPacedServer(t, perSecond)

	tlsDial := func(ip string) error {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
		conn, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test does not authenticate the server
		if err != nil {
			return err
		}
		return conn.Close()
	}
	var burstDone atomic.Int32
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() {
			if err := tlsDial("127.0.0.1"); err != nil {
				t.Errorf("burst connection %d: %v", i, err)
			}
			burstDone.Add(1)
		})
	}
	// The burst's dials reach the server and wait for their turns; the first perSecond have theirs.
	waitFor(t, "the burst's first handshakes", func() bool { return burstDone.Load() >= perSecond })
	if err := tlsDial("127.0.0.2"); err != nil {
		t.Fatal(err)
	}
	before := burstDone.Load()
	wg.Wait()
	// Its turn comes after at most one more of the burst's (the turn under way when it dialed).
	if before > perSecond+2 {
		t.Errorf("the other client's handshake came after %d of the burst's %d, want at most %d", before, burst, perSecond+2)
	}
}
