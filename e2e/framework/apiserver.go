package framework

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// RestartAPIServer restarts the local cluster's kube-apiserver the way a supervisor restarts a
// control-plane component: SIGTERM, SIGKILL if it has not exited after grace (it stops accepting
// requests at once, but then waits up to a minute for open connections), start the same binary
// with the same command line, environment and log file, and return once it is ready. The harness
// runs it as a plain process (hack/local-up-cluster.sh), so this is the whole of a restart; etcd
// and every other component keep running. The new process outlives the test; `make cluster-down`
// stops it like the old one. It returns how long the old process took to exit and how long the
// API server was unreachable.
func (c *Cluster) RestartAPIServer(grace, timeout time.Duration) (stopped, unreachable time.Duration, err error) {
	if !c.Local {
		return 0, 0, errors.New("only the local harness cluster's API server can be restarted")
	}
	port, err := c.apiServerPort()
	if err != nil {
		return 0, 0, err
	}
	pid, err := listenerPID(port)
	if err != nil {
		return 0, 0, err
	}
	argv, err := procStrings(pid, "cmdline")
	if err != nil {
		return 0, 0, err
	}
	if len(argv) == 0 || filepath.Base(argv[0]) != "kube-apiserver" {
		return 0, 0, fmt.Errorf("port %d is served by PID %d %q, not a kube-apiserver", port, pid, argv[0])
	}
	env, err := procStrings(pid, "environ")
	if err != nil {
		return 0, 0, err
	}
	dir, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil {
		return 0, 0, err
	}
	logPath, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/1", pid))
	if err != nil {
		return 0, 0, err
	}

	down := time.Now()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return 0, 0, fmt.Errorf("stop kube-apiserver PID %d: %w", pid, err)
	}
	deadline, killAt := time.Now().Add(timeout), time.Now().Add(grace)
	for alive(pid) || listening(port) {
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("kube-apiserver PID %d still running %s after SIGTERM", pid, timeout)
		}
		if !killAt.IsZero() && time.Now().After(killAt) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			killAt = time.Time{}
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopped = time.Since(down)

	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return 0, 0, err
	}
	defer logFile.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = env, dir, logFile, logFile
	// Its own session: the test's end must not take the cluster's API server with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, 0, fmt.Errorf("start %s: %w", argv[0], err)
	}
	go func() { _ = cmd.Wait() }()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.Clientset.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil {
			return stopped, time.Since(down), nil
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("kube-apiserver (PID %d) not ready %s after its restart: %w", cmd.Process.Pid, timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (c *Cluster) apiServerPort() (int, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return 0, err
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return 0, err
	}
	if u.Port() == "" {
		return 443, nil
	}
	return strconv.Atoi(u.Port())
}

var ssPID = regexp.MustCompile(`pid=([0-9]+)`)

// listenerPID is the process listening on the TCP port.
func listenerPID(port int) (int, error) {
	out, err := exec.Command("ss", "-ltnpH", fmt.Sprintf("sport = :%d", port)).Output()
	if err != nil {
		return 0, fmt.Errorf("ss: %w", err)
	}
	m := ssPID.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("nothing listens on port %d", port)
	}
	return strconv.Atoi(string(m[1]))
}

func listening(port int) bool {
	out, _ := exec.Command("ss", "-ltnH", fmt.Sprintf("sport = :%d", port)).Output()
	return len(bytes.TrimSpace(out)) > 0
}

// alive: the process exists and has not exited (a zombie waits for its parent to reap it).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may contain blanks, the state follows the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || !strings.HasPrefix(string(stat[i+1:]), " Z")
}

// procStrings reads a NUL-separated /proc/<pid>/ file (cmdline, environ).
func procStrings(pid int, file string) ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	if err != nil {
		return nil, err
	}
	trimmed := strings.TrimRight(string(data), "\x00")
	if trimmed == "" {
		return nil, nil
	}
	return strings.Split(trimmed, "\x00"), nil
}
