package server

import (
	"net"
	"slices"
)

// turns are the connections taken from the listen queue that wait for their handshake, by client
// address, handed out a client at a time in turn: a client that dials hundreds of connections at
// once (an API server whose reviews queued) no longer holds the dials of another (a second API
// server, which the listen queue would serve only after all of them). Not safe for concurrent
// use.
type turns struct {
	byPeer map[string][]net.Conn
	// ring are the clients with connections waiting, in the order of their turns; next is the
	// index in ring of the one whose turn is next.
	ring []string
	next int
	// n is the number of connections waiting.
	n int
}

func newTurns() *turns { return &turns{byPeer: map[string][]net.Conn{}} }

// push adds conn behind the other connections of its client.
func (t *turns) push(conn net.Conn) {
	p := peerOf(conn)
	if len(t.byPeer[p]) == 0 {
		t.ring = append(t.ring, p)
	}
	t.byPeer[p] = append(t.byPeer[p], conn)
	t.n++
}

// pop returns the oldest connection of the client whose turn it is, and passes the turn on; nil
// when none waits.
func (t *turns) pop() net.Conn {
	if t.n == 0 {
		return nil
	}
	if t.next >= len(t.ring) {
		t.next = 0
	}
	p := t.ring[t.next]
	waiting := t.byPeer[p]
	conn := waiting[0]
	waiting[0] = nil
	if len(waiting) == 1 {
		// The client's last: it leaves the ring, and the one after it has the next turn.
		delete(t.byPeer, p)
		t.ring = slices.Delete(t.ring, t.next, t.next+1)
	} else {
		t.byPeer[p] = waiting[1:]
		t.next++
	}
	t.n--
	return conn
}

// closeAll closes every connection waiting.
func (t *turns) closeAll() {
	for conn := t.pop(); conn != nil; conn = t.pop() {
		conn.Close()
	}
}

// peerOf is the client's address without its port: the connections of one API server come from
// many ports.
func peerOf(conn net.Conn) string {
	addr := conn.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}
