package scale

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/certs"
	"github.com/gpu-dra/gpu-dra/internal/manifest"
)

// chart is what the harness takes from one render of the chart (a golden file of charts/charttest):
// the DeviceClasses, the webhook configurations and the webhook container's command and GOGC.
type chart struct {
	classes    []*resourceapi.DeviceClass
	validating *admissionregistrationv1.ValidatingWebhookConfiguration
	mutating   *admissionregistrationv1.MutatingWebhookConfiguration
	command    []string
	namespace  string
	// memoryLimit (bytes) and gogc are the webhook container's memory limit and GOGC: how the
	// chart runs it, which a restart's peak is measured with.
	memoryLimit int64
	gogc        string
	// goMemLimit is the container's GOMEMLIMIT when the chart sets a value ("" when it sets
	// it from the memory limit, or not at all).
	goMemLimit string
}

// asChart is o with the webhook's GOGC and GOMEMLIMIT as the chart sets them, or o's when the
// chart sets neither.
func (c *chart) asChart(o Options) Options {
	if c.gogc == "" || (c.memoryLimit == 0 && c.goMemLimit == "") {
		return o
	}
	o.GOGC, o.GOMemLimit = c.gogc, c.goMemLimit
	if o.GOMemLimit == "" {
		o.GOMemLimit = strconv.FormatInt(c.memoryLimit, 10)
	}
	return o
}

func readChart(path string) (*chart, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("chart render: %w", err)
	}
	c := &chart{}
	for _, d := range manifest.Documents(data) {
		if d.Err != nil {
			// Documents the golden file holds besides objects (NOTES.txt); an object the harness
			// needs that does not parse is missing below.
			continue
		}
		var into any
		switch d.GVK.Kind {
		case "DeviceClass":
			if d.GVK.Version != "v1" {
				return nil, fmt.Errorf("chart render %s: DeviceClass %s is %s; use the render of a release serving resource.k8s.io/v1", path, d.Name, d.GVK.Version)
			}
			dc := &resourceapi.DeviceClass{}
			c.classes, into = append(c.classes, dc), dc
		case "ValidatingWebhookConfiguration":
			c.validating = &admissionregistrationv1.ValidatingWebhookConfiguration{}
			into = c.validating
		case "MutatingWebhookConfiguration":
			c.mutating = &admissionregistrationv1.MutatingWebhookConfiguration{}
			into = c.mutating
		case "Deployment":
			dep := &appsv1.Deployment{}
			if err := yaml.Unmarshal(d.Raw, dep); err != nil {
				return nil, fmt.Errorf("chart render %s: Deployment %s: %w", path, d.Name, err)
			}
			for _, ctr := range dep.Spec.Template.Spec.Containers {
				if ctr.Name == "webhook" {
					c.command, c.namespace = ctr.Command, dep.Namespace
					c.memoryLimit = ctr.Resources.Limits.Memory().Value()
					for _, e := range ctr.Env {
						switch e.Name {
						case "GOGC":
							c.gogc = e.Value
						case "GOMEMLIMIT":
							c.goMemLimit = e.Value
						}
					}
				}
			}
			continue
		default:
			continue
		}
		if err := yaml.Unmarshal(d.Raw, into); err != nil {
			return nil, fmt.Errorf("chart render %s: %s %s: %w", path, d.GVK.Kind, d.Name, err)
		}
	}
	if c.validating == nil || c.mutating == nil || len(c.command) == 0 || len(c.classes) == 0 {
		return nil, fmt.Errorf("chart render %s: want DeviceClasses, both webhook configurations and the webhook Deployment", path)
	}
	return c, nil
}

// install creates the namespace, the classes and the webhook configurations, pointed at url
// (https://localhost:PORT) and trusting ca.
func (c *chart) install(ctx context.Context, cs kubernetes.Interface, url string, ca []byte) error {
	if err := c.createClasses(ctx, cs); err != nil {
		return err
	}
	point := func(cc *admissionregistrationv1.WebhookClientConfig) {
		path := ""
		if cc.Service != nil && cc.Service.Path != nil {
			path = *cc.Service.Path
		}
		u := url + path
		cc.Service, cc.URL, cc.CABundle = nil, &u, ca
	}
	for i := range c.validating.Webhooks {
		point(&c.validating.Webhooks[i].ClientConfig)
	}
	for i := range c.mutating.Webhooks {
		point(&c.mutating.Webhooks[i].ClientConfig)
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, c.validating, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ValidatingWebhookConfiguration: %w", err)
	}
	if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, c.mutating, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create MutatingWebhookConfiguration: %w", err)
	}
	return nil
}

// createClasses creates the chart's namespace, its DeviceClasses and the loads' namespace.
func (c *chart) createClasses(ctx context.Context, cs kubernetes.Interface) error {
	for _, ns := range []string{c.namespace, loadNamespace} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	for _, dc := range c.classes {
		if _, err := cs.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create DeviceClass %s: %w", dc.Name, err)
		}
	}
	return nil
}

// localOnly are the chart's flags that name in-cluster things; the harness sets its own.
var localOnly = []string{"--node-groups", "--cert-dir", "--port", "--health-probe-bind-address", "--metrics-bind-address",
	"--cert-mode", "--cert-secret", "--webhook-service", "--validating-webhook-config", "--mutating-webhook-config", "--host", "--namespace"}

// webhook is the gpu-webhook process the harness runs on loopback.
type webhook struct {
	cmd                  *exec.Cmd
	port, health, metric int
	dir                  string
	ca                   []byte
	gogc                 int
	httpClient           *http.Client
	// dialing is how many connections httpClient is making (reviewer.review).
	dialing atomic.Int64
}

// startWebhook writes a serving certificate for localhost and starts bin with the chart's flags,
// loopback addresses, o's node groups, GOGC and GOMEMLIMIT.
func startWebhook(ctx context.Context, c *chart, o Options, dir string) (*webhook, error) {
	w := &webhook{dir: dir}
	var err error
	if w.gogc, err = strconv.Atoi(o.GOGC); err != nil || w.gogc <= 0 {
		return nil, fmt.Errorf("--webhook-gogc=%q: want a positive number, e.g. 100", o.GOGC)
	}
	if w.ca, err = writeServingCert(filepath.Join(dir, "certs")); err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	w.port, w.health, w.metric = ports[0], ports[1], ports[2]
	args := []string{}
	for _, a := range c.command[1:] {
		name, _, _ := strings.Cut(a, "=")
		keep := true
		for _, l := range localOnly {
			keep = keep && name != l
		}
		if keep {
			args = append(args, a)
		}
	}
	args = append(args, "--node-groups="+o.NodeGroups, "--cert-dir="+filepath.Join(dir, "certs"), "--cert-mode=file",
		"--host=127.0.0.1", fmt.Sprintf("--port=%d", w.port),
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", w.health),
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", w.metric), "--namespace="+c.namespace)
	log, err := os.Create(filepath.Join(dir, "webhook.log"))
	if err != nil {
		return nil, err
	}
	w.cmd = exec.Command(o.Webhook, args...)
	w.cmd.Stdout, w.cmd.Stderr = log, log
	w.cmd.Env = append(os.Environ(), "KUBECONFIG="+o.Kubeconfig, "GOGC="+o.GOGC, "GOMEMLIMIT="+o.GOMemLimit)
	klog.FromContext(ctx).Info("Starting the webhook", "binary", o.Webhook, "args", args, "GOGC", o.GOGC, "GOMEMLIMIT", o.GOMemLimit, "log", log.Name())
	if err := w.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", o.Webhook, err)
	}
	return w, nil
}

// writeServingCert writes a CA and a serving certificate for localhost into dir (tls.crt,
// tls.key) and returns the CA certificate, which the harness's clients trust.
func writeServingCert(dir string) ([]byte, error) {
	now := time.Now()
	caCert, caKey, err := certs.NewCA("gpu-dra-scale", now, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	cert, key, err := certs.NewServing(caCert, caKey, []string{"localhost"}, now, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	if _, err := certs.WriteFiles(dir, certs.Bundle{CACert: caCert, CAKey: caKey, Cert: cert, Key: key}); err != nil {
		return nil, err
	}
	return caCert, nil
}

// reviewers send template and pod AdmissionReviews straight to w.
func (c *chart) reviewers(w *webhook, l *loader) (templates, pods *reviewer, err error) {
	v, m := c.validating.Webhooks[0], c.mutating.Webhooks[0]
	if templates, err = newReviewer(w, c.path(v.ClientConfig)+timeoutQuery(v.TimeoutSeconds), l.templateObjects()); err != nil {
		return nil, nil, err
	}
	if pods, err = newReviewer(w, c.path(m.ClientConfig)+timeoutQuery(m.TimeoutSeconds), l.podObject()); err != nil {
		return nil, nil, err
	}
	return templates, pods, nil
}

// timeoutQuery is what the API server adds to a webhook's URL: how long it waits for the answer,
// which the webhook may bound its work by.
func timeoutQuery(seconds *int32) string {
	if seconds == nil {
		return "?timeout=10s" // the API server's default timeoutSeconds
	}
	return fmt.Sprintf("?timeout=%ds", *seconds)
}

// path is the path of a webhook's URL (after install) or service reference.
func (c *chart) path(cc admissionregistrationv1.WebhookClientConfig) string {
	if cc.URL != nil {
		if u, err := url.Parse(*cc.URL); err == nil {
			return u.Path
		}
	}
	if cc.Service != nil && cc.Service.Path != nil {
		return *cc.Service.Path
	}
	return "/"
}

func (w *webhook) pid() int { return w.cmd.Process.Pid }

func (w *webhook) url() string { return fmt.Sprintf("https://localhost:%d", w.port) }

// waitReady waits for /readyz: server up and inventory caches synced.
func (w *webhook) waitReady(ctx context.Context, timeout time.Duration) error {
	return poll(ctx, timeout, "webhook /readyz", func() (bool, error) {
		if w.cmd.ProcessState != nil {
			return false, fmt.Errorf("webhook exited: %s (log: %s)", w.cmd.ProcessState, filepath.Join(w.dir, "webhook.log"))
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", w.health))
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

func (w *webhook) stop() {
	if w.httpClient != nil {
		w.httpClient.CloseIdleConnections()
	}
	if w.cmd.Process != nil {
		_ = w.cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = w.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = w.cmd.Process.Kill()
		}
	}
}

// memory is the webhook's memory at one moment.
type memory struct {
	RSS, HWM  int64 // bytes: resident now, and at most so far
	Anon      int64 // bytes: of RSS, anonymous (heap, stacks) rather than the binary's pages
	HeapInuse int64 // bytes: go_memstats_heap_inuse_bytes
	// StackInuse is go_memstats_stack_inuse_bytes: the goroutines' stacks (the serving
	// connections' among them), which are not heap.
	StackInuse int64
	// Live is the heap the last collection found live: the next collection's target over
	// 1+GOGC/100.
	Live   int64
	Synced time.Duration
	// Meanwhile is what went on between the /readyz of a webhook started for the reading and
	// the reading (nil where none was started).
	Meanwhile *activity
}

func (w *webhook) memory() (memory, error) {
	m, err := procMemory(w.cmd.Process.Pid)
	if err != nil {
		return m, err
	}
	v, err := w.metricValue("go_memstats_heap_inuse_bytes")
	if err != nil {
		return m, err
	}
	m.HeapInuse = int64(v)
	if v, err = w.metricValue("go_memstats_stack_inuse_bytes"); err != nil {
		return m, err
	}
	m.StackInuse = int64(v)
	next, err := w.metricValue("go_memstats_next_gc_bytes")
	if err != nil {
		return m, err
	}
	m.Live = int64(next / (1 + float64(w.gogc)/100))
	return m, nil
}

// procMemory reads a process's resident memory from /proc.
func procMemory(pid int) (memory, error) {
	var m memory
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			m.RSS = kb << 10
		case "VmHWM:":
			m.HWM = kb << 10
		case "RssAnon:":
			m.Anon = kb << 10
		}
	}
	return m, s.Err()
}

// metricValue reads one unlabelled sample from the webhook's /metrics.
func (w *webhook) metricValue(name string) (float64, error) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", w.metric))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, errors.Join(s.Err(), fmt.Errorf("metric %s not found", name))
}

func freePorts(n int) ([]int, error) {
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// poll calls cond every 100 ms until it is true, fails or timeout passes.
func poll(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
