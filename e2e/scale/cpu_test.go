package scale

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSampleCPU(t *testing.T) {
	a, err := sampleCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Burn some CPU so the process's time moves.
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); {
	}
	b, err := sampleCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if b.total <= a.total || b.process <= a.process {
		t.Errorf("CPU time did not move: %+v → %+v", a, b)
	}
	if s := stealPercent(a, b); s < 0 || s > 100 {
		t.Errorf("steal %.1f%%", s)
	}
	if c := cpuPer(a, b, 1); c <= 0 || c > 2*time.Second {
		t.Errorf("CPU per request %s after burning 300 ms", c)
	}
	if _, err := sampleCPU(1 << 30); err == nil {
		t.Error("a missing process gave no error")
	}
}

func TestStealAndCPUPer(t *testing.T) {
	a := cpuSample{total: 1000, steal: 100, idle: 500, process: 10}
	b := cpuSample{total: 2000, steal: 350, idle: 800, process: 60}
	if s := stealPercent(a, b); s != 25 {
		t.Errorf("steal %.1f%%, want 25%%", s)
	}
	if s := busyPercent(a, b); s != 45 {
		t.Errorf("busy %.1f%%, want 45%%", s)
	}
	if c := cpuPer(a, b, 100); c != 5*time.Millisecond {
		t.Errorf("CPU per request %s, want 5ms", c)
	}
	if stealPercent(b, a) != 0 || cpuPer(a, b, 0) != 0 {
		t.Error("degenerate samples not handled")
	}
}

func TestFindProcesses(t *testing.T) {
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	pids, err := findProcesses([]string{strings.TrimSpace(string(comm))})
	if err != nil || !slices.Contains(pids, os.Getpid()) {
		t.Errorf("own process %d not found: %v, %v", os.Getpid(), pids, err)
	}
	if _, err := findProcesses([]string{"no-such-process-x"}); err == nil {
		t.Error("no error for a name no process has")
	}
}
