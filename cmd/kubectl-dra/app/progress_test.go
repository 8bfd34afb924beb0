package app

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is written by the progress timer's goroutine and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestProgress(t *testing.T) {
	t.Run("fast lists say nothing", func(t *testing.T) {
		var out syncBuffer
		p := newProgress(&out, 50*time.Millisecond)
		p.begin("ResourceSlices")
		p.done("ResourceSlices", 1000)
		p.stop()
		time.Sleep(100 * time.Millisecond)
		if out.String() != "" {
			t.Errorf("printed %q", out.String())
		}
	})
	t.Run("slow lists are named, then each arrival", func(t *testing.T) {
		var out syncBuffer
		p := newProgress(&out, 10*time.Millisecond)
		p.begin("ResourceSlices")
		p.begin("ResourceClaims")
		p.done("ResourceClaims", 3)
		time.Sleep(100 * time.Millisecond)
		p.done("ResourceSlices", 1000)
		p.stop()
		p.done("Nodes", 5) // after stop: silent
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "kubectl dra: listing ResourceSlices (") || !strings.HasPrefix(lines[1], "kubectl dra: 1000 ResourceSlices listed (") {
			t.Errorf("printed:\n%s", out.String())
		}
	})
	t.Run("pages are counted", func(t *testing.T) {
		var out syncBuffer
		p := newProgress(&out, 10*time.Millisecond)
		p.begin("ResourceClaims")
		time.Sleep(100 * time.Millisecond)
		p.page("ResourceClaims", 500)
		p.page("ResourceClaims", 234)
		p.done("ResourceClaims", 734)
		p.stop()
		if !strings.Contains(out.String(), "kubectl dra: 734 ResourceClaims listed in 2 pages (") {
			t.Errorf("printed:\n%s", out.String())
		}
	})
	t.Run("a terminal sees pages and objects read, then a clean line", func(t *testing.T) {
		var out syncBuffer
		p := newProgress(&out, time.Hour)
		p.tty = true
		p.begin("ResourceSlices")
		p.begin("ResourceClaims")
		p.show()
		p.page("ResourceClaims", 500)
		p.page("ResourceClaims", 500)
		p.stop()
		got := out.String()
		if !strings.Contains(got, "\r\033[Kkubectl dra: listing ResourceSlices, ResourceClaims 1000 (2 pages) (") || !strings.HasSuffix(got, "\r\033[K") {
			t.Errorf("printed %q", got)
		}
	})
}
