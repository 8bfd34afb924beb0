package scale

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// cpuSample is the machine's CPU accounting and one process's CPU time at one moment. The VM
// these runs happen on shares its host: time the host gave to others (steal) slows every
// request alike, so each load reports it, and the webhook's own CPU time per request, which
// steal does not inflate, says what a review costs.
type cpuSample struct {
	total, steal, idle int64 // machine: clock ticks over all CPUs, of them stolen, idle (with iowait)
	process            int64 // the process's user+system ticks
}

// clockTicks is USER_HZ, 100 on every Linux architecture the harness runs on.
const clockTicks = 100

func sampleCPU(pid int) (cpuSample, error) {
	var s cpuSample
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, err
	}
	line, _, _ := strings.Cut(string(stat), "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return s, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	for i, f := range fields[1:] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return s, fmt.Errorf("/proc/stat: %w", err)
		}
		if i < 8 { // user nice system idle iowait irq softirq steal; guest is inside user
			s.total += v
		}
		switch i {
		case 3, 4:
			s.idle += v
		case 7:
			s.steal = v
		}
	}
	if pid > 0 {
		if _, s.process, err = procStat(strconv.Itoa(pid)); err != nil {
			return s, err
		}
	}
	return s, nil
}

// ticks is a count of clock ticks as time.
func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / clockTicks }

// procStat reads /proc/PID/stat: the process's parent and its user+system clock ticks.
func procStat(pid string) (ppid string, ticks int64, err error) {
	_, ppid, ticks, err = readProcStat(pid)
	return ppid, ticks, err
}

// readProcStat reads /proc/PID/stat: the process's command name, parent and user+system clock
// ticks.
func readProcStat(pid string) (comm, ppid string, ticks int64, err error) {
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return "", "", 0, err
	}
	// The command name is in parentheses and may hold spaces and parentheses; the fields after
	// it: state, ppid, ... utime and stime are the 12th and 13th.
	line := string(data)
	open, end := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return "", "", 0, fmt.Errorf("/proc/%s/stat: no command name", pid)
	}
	f := strings.Fields(line[end+1:])
	if len(f) < 13 {
		return "", "", 0, fmt.Errorf("/proc/%s/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return "", "", 0, fmt.Errorf("/proc/%s/stat: utime %q, stime %q", pid, f[11], f[12])
	}
	return line[open+1 : end], f[1], utime + stime, nil
}

// stealPercent is the share of the machine's CPU time stolen between a and b.
func stealPercent(a, b cpuSample) float64 {
	if b.total <= a.total {
		return 0
	}
	return 100 * float64(b.steal-a.steal) / float64(b.total-a.total)
}

// busyPercent is the share of the machine's CPU time some process ran between a and b.
func busyPercent(a, b cpuSample) float64 {
	if b.total <= a.total {
		return 0
	}
	return 100 * float64((b.total-a.total)-(b.idle-a.idle)-(b.steal-a.steal)) / float64(b.total-a.total)
}

// cpuPer is the process's CPU time between a and b divided by n.
func cpuPer(a, b cpuSample, n int) time.Duration {
	if n == 0 {
		return 0
	}
	return ticks(b.process-a.process) / time.Duration(n)
}

// controlPlaneNames are the control planes' processes that keep running during the loads straight
// to the webhooks (the fleet's and the baseline's; the controllers are paused, see
// pauseControllers).
var controlPlaneNames = []string{"kube-apiserver", "etcd"}

// processGroup is the CPU time of a set of processes, found once.
type processGroup struct{ pids []int }

// findControlPlanes is the processes named in controlPlaneNames; none when they cannot be listed
// (the group then reads no CPU time).
func findControlPlanes() processGroup {
	pids, _ := findProcesses(controlPlaneNames)
	return processGroup{pids: pids}
}

// groupSample is a group's CPU time at one moment.
type groupSample struct {
	ticks int64
	at    time.Time
}

func (g processGroup) sample() groupSample {
	s := groupSample{at: time.Now()}
	for _, pid := range g.pids {
		// A process gone since the group was found took no more CPU time.
		if _, t, err := procStat(strconv.Itoa(pid)); err == nil {
			s.ticks += t
		}
	}
	return s
}

// since is the share of one CPU the group took from before until now.
func (g processGroup) since(before groupSample) float64 {
	now := g.sample()
	elapsed := now.at.Sub(before.at)
	if elapsed <= 0 || now.ticks < before.ticks {
		return 0
	}
	return float64(ticks(now.ticks-before.ticks)) / float64(elapsed)
}
