package framework

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// crictl runs crictl against the local cluster's container runtime.
func (c *Cluster) crictl(args ...string) (string, error) {
	if c.CRIEndpoint == "" {
		return "", errors.New("no container runtime endpoint: GPU_DRA_CRI_ENDPOINT is set by e2e/run.sh on its own cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "crictl", append([]string{"--runtime-endpoint", c.CRIEndpoint}, args...)...).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(exit.Stderr)))
		}
		return "", fmt.Errorf("crictl %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

// ErrNotRunning: the container is not running now (restarting after a crash, or its pod going).
var ErrNotRunning = errors.New("not running")

// ContainerPID is the host PID of the main process of a pod's running container, as the container
// runtime reports it.
func (c *Cluster) ContainerPID(ns, pod, container string) (int, error) {
	out, err := c.crictl("ps", "-q", "--state", "running", "--name", "^"+container+"$",
		"--label", "io.kubernetes.pod.namespace="+ns, "--label", "io.kubernetes.pod.name="+pod)
	if err != nil {
		return 0, err
	}
	ids := strings.Fields(out)
	if len(ids) == 0 {
		return 0, fmt.Errorf("pod %s/%s, container %s: %w", ns, pod, container, ErrNotRunning)
	}
	if len(ids) != 1 {
		return 0, fmt.Errorf("pod %s/%s: %d running containers named %s, want 1", ns, pod, len(ids), container)
	}
	out, err = c.crictl("inspect", "-o", "go-template", "--template", "{{.info.pid}}", ids[0])
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("container %s of pod %s/%s: PID %q", ids[0], ns, pod, strings.TrimSpace(out))
	}
	return pid, nil
}

// KillContainer ends a pod's container with SIGKILL to its main process, as a crash or the OOM
// killer would: nothing of its own shutdown runs, and the kubelet restarts it (with its back-off).
func (c *Cluster) KillContainer(ns, pod, container string) error {
	pid, err := c.ContainerPID(ns, pod, container)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill PID %d of pod %s/%s: %w", pid, ns, pod, err)
	}
	return nil
}
