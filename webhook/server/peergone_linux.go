package server

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// peerGone reports whether conn's client has closed its side: the kernel completed the
// connection while it waited in the listen queue, and the client closed it when its handshake
// timed out. Its ClientHello may still be there to read, so only the TCP state tells.
func peerGone(conn net.Conn) bool {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var state uint8
	var sockErr error
	if err := raw.Control(func(fd uintptr) {
		var info *unix.TCPInfo
		if info, sockErr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); sockErr == nil {
			state = info.State
		}
	}); err != nil || sockErr != nil {
		return false
	}
	// Anything but established (close-wait: the client's FIN arrived; close: its RST) has no
	// client left to handshake with.
	return state != unix.BPF_TCP_ESTABLISHED
}
