package scale

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"
)

// upstreamPath is where the upstream example driver's webhook (kubernetes-sigs/dra-example-driver,
// cmd/dra-example-webhook) validates ResourceClaims and ResourceClaimTemplates.
const upstreamPath = "/validate-resource-claim-parameters"

// upstream is the upstream example driver's webhook, run as a load target: it gets the same
// template AdmissionReviews as ours, at the same rate, interleaved. It keeps no informers (it only
// decodes the opaque parameters of its own driver), so neither its latency nor its memory depends
// on the fleet: it is the floor of what serving a review over TLS costs in Go on this machine.
type upstream struct {
	*webhook
}

// startUpstream writes a serving certificate for localhost and starts bin on a free port. The
// binary listens on every address (it takes a port, not an address); the harness only sends to
// loopback.
func startUpstream(ctx context.Context, bin, driver, dir string) (*upstream, error) {
	certDir := filepath.Join(dir, "certs")
	ca, err := writeServingCert(certDir)
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	w := &webhook{dir: dir, ca: ca, port: ports[0]}
	log, err := os.Create(filepath.Join(dir, "webhook.log"))
	if err != nil {
		return nil, err
	}
	args := []string{"--tls-cert-file=" + filepath.Join(certDir, "tls.crt"), "--tls-private-key-file=" + filepath.Join(certDir, "tls.key"),
		fmt.Sprintf("--port=%d", w.port), "--device-profile=gpu", "--driver-name=" + driver}
	w.cmd = exec.Command(bin, args...)
	w.cmd.Stdout, w.cmd.Stderr = log, log
	w.cmd.Env = append(os.Environ(), "GOGC=100", "GOMEMLIMIT=off")
	klog.FromContext(ctx).Info("Starting the upstream example webhook", "binary", bin, "args", args, "log", log.Name())
	if err := w.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	u := &upstream{w}
	if err := u.waitReady(ctx, time.Minute); err != nil {
		u.stop()
		return nil, err
	}
	return u, nil
}

// waitReady waits for its /readyz, served on its TLS port.
func (u *upstream) waitReady(ctx context.Context, timeout time.Duration) error {
	r, err := newReviewer(u.webhook, "/readyz", nil)
	if err != nil {
		return err
	}
	return poll(ctx, timeout, "upstream webhook /readyz", func() (bool, error) {
		if u.cmd.ProcessState != nil {
			return false, fmt.Errorf("upstream webhook exited: %s (log: %s)", u.cmd.ProcessState, filepath.Join(u.dir, "webhook.log"))
		}
		resp, err := r.client.Get(r.url)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// memory is its RSS: it serves no metrics.
func (u *upstream) memory() (memory, error) { return procMemory(u.pid()) }

// upstreamTemplates is the reviewer sending u the loader's templates, with the timeout the chart's
// configuration gives the API server.
func (c *chart) upstreamTemplates(u *upstream, l *loader) (*reviewer, error) {
	return newReviewer(u.webhook, upstreamPath+timeoutQuery(c.validating.Webhooks[0].TimeoutSeconds), l.templateObjects())
}
