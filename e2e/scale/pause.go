package scale

import (
	"fmt"
	"slices"
	"strconv"
	"syscall"

	"k8s.io/klog/v2"
)

// controllers are the control plane's processes a direct load does not need (their comm names,
// which the kernel cuts at 15 bytes). They are busy in proportion to the fleet (the node lifecycle
// controller looks at every node every few seconds, and most fake nodes never report Ready), and on
// two CPUs that work lands in the webhook's latency tail, which the direct loads are there to
// measure.
var controllers = []string{"kube-controller", "kube-scheduler"}

// pauseControllers stops (SIGSTOP) the processes named in controllers and returns what resumes
// them (SIGCONT). Processes that cannot be found or signalled are logged and left alone.
func pauseControllers(logger klog.Logger) (resume func()) {
	pids, err := findProcesses(controllers)
	if err != nil {
		logger.Info("Cannot list processes; the controllers keep running during the direct loads", "err", err)
		return func() {}
	}
	var stopped []int
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			logger.Info("Cannot pause a controller", "pid", pid, "err", err)
			continue
		}
		stopped = append(stopped, pid)
	}
	logger.V(2).Info("Controllers paused for the direct loads", "pids", stopped)
	return func() {
		for _, pid := range stopped {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				logger.Info("Cannot resume a controller", "pid", pid, "err", err)
			}
		}
	}
}

// findProcesses lists the pids whose comm is one of names.
func findProcesses(names []string) ([]int, error) {
	procs, err := processes()
	if err != nil {
		return nil, err
	}
	var out []int
	for pid, p := range procs {
		if slices.Contains(names, p.comm) {
			n, err := strconv.Atoi(pid)
			if err != nil {
				return nil, err
			}
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no process named %v", names)
	}
	return out, nil
}
