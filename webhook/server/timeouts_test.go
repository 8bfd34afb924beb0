package server

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// TestConnectionTimeouts: a connection that stalls in its headers, in its body or between requests
// is closed by the webhook server (controller-runtime's waits 32 s for headers, forever for a body).
func TestConnectionTimeouts(t *testing.T) {
	dir := t.TempDir()
	writeCert(t, dir, 1)
	o := NewOptions()
	o.CertDir = dir
	o.Timeouts = Timeouts{ReadHeader: 300 * time.Millisecond, Read: 600 * time.Millisecond, Idle: 300 * time.Millisecond, MaxHeaderBytes: 4 << 10}
	addr := startWebhookServer(t, o, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			w.WriteHeader(http.StatusRequestTimeout)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	request := "POST /ping HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
	for _, tc := range []struct {
		name, send string
		wantStatus string // the answer before the server closes, if any
	}{
		{name: "headers stall", send: "POST /ping HTTP/1.1\r\nHost: webhook\r\n"},
		{name: "body stalls", send: "POST /ping HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\nContent-Length: 7000000\r\n\r\n{", wantStatus: "HTTP/1.1 408"},
		{name: "idle after a request", send: request, wantStatus: "HTTP/1.1 200"},
		{name: "headers too large", send: "POST /ping HTTP/1.1\r\nHost: webhook\r\nX-Pad: " + strings.Repeat("x", 8<<10) + "\r\n\r\n", wantStatus: "HTTP/1.1 431"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test does not authenticate the server
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, tc.send); err != nil {
				t.Fatal(err)
			}
			// Far longer than any of the timeouts: only a connection nobody closes reaches it.
			if err := conn.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
				t.Fatal(err)
			}
			r := bufio.NewReader(conn)
			if tc.wantStatus != "" {
				resp, err := http.ReadResponse(r, nil)
				if err != nil {
					t.Fatalf("no answer: %v", err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if !strings.HasPrefix("HTTP/1.1 "+resp.Status, tc.wantStatus) {
					t.Errorf("answer %s, want %s", resp.Status, tc.wantStatus)
				}
			}
			_, err = r.ReadByte() // the connection's end
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("the server kept the connection open")
			}
			if err == nil {
				t.Fatal("the server sent more than one answer")
			}
			var netErr net.Error
			if !errors.Is(err, io.EOF) && !errors.As(err, &netErr) {
				t.Fatalf("read: %v, want the connection closed", err)
			}
		})
	}
}

// TestIdleOutlastsAPIServerClient: the webhook server keeps an idle connection longer than the
// API server's webhook client does (client-go's transport, as utilnet's defaults set it), so the
// client closes it first and never writes a review to a connection the server is closing.
func TestIdleOutlastsAPIServerClient(t *testing.T) {
	client := utilnet.SetTransportDefaults(&http.Transport{}).IdleConnTimeout
	if got := DefaultTimeouts().Idle; client == 0 || got <= client {
		t.Errorf("webhook server idle timeout %s, API server's client %s: want the server's longer", got, client)
	}
}
