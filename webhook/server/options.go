// Package server wires the admission handlers into a controller-runtime manager: the TLS webhook
// server (certificates reloaded from CertDir when they change), health and readiness probes,
// Prometheus metrics and the inventory informers.
package server

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation"
	"github.com/gpu-dra/gpu-dra/internal/cliflag"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/webhook/podinject"
)

// Paths the handlers are served on.
const (
	ValidateClaimPath = "/validate-resource-claim"
)

// Options are the settings of the webhook binary.
type Options struct {
	DriverName             string
	NodeGroupsFile         string
	CertDir                string
	CertName               string
	KeyName                string
	Host                   string
	Port                   int
	HealthProbeBindAddress string
	MetricsBindAddress     string
	Resync                 time.Duration
	// Timeouts of the webhook server's connections.
	Timeouts Timeouts
	// MaxRequestsInFlight bounds the requests the webhook server handles at once (limitInFlight).
	MaxRequestsInFlight int
	// MaxConnections bounds the connections the webhook server has open at once (see Start); 0
	// means MaxRequestsInFlight and room for the API servers' idle connections (idleRoom).
	MaxConnections int
	// MaxHandshakesPerSecond paces the connections let through to their TLS handshake
	// (pacedListener).
	MaxHandshakesPerSecond int
	// ShutdownDelay is how long the webhook keeps serving, not ready, after SIGTERM (see Run).
	ShutdownDelay time.Duration

	// Deny lists the rules whose findings reject instead of warn.
	Deny []claimvalidation.Rule
	// ExcludedNamespaces are those the webhook configurations' namespaceSelector excludes; pod
	// injection refuses reviews for them (only a client other than the API server sends one).
	ExcludedNamespaces []string
	// MaxTemplatesPerNamespace bounds the managed templates pod injection creates in a namespace.
	MaxTemplatesPerNamespace int

	// DeviceClasses are the chart's classes (default: one named DriverName); the first serves
	// the pod annotations.
	DeviceClasses []podinject.DeviceClass
	// Namespace is the webhook's own, where it probes what the API server serves with dry-run
	// objects (no webhook of the chart judges the release namespace; elsewhere the probes only
	// draw a warning of the webhook's own).
	Namespace string
}

// NewOptions returns the chart's defaults.
func NewOptions() *Options {
	return &Options{
		DriverName:               deviceschema.DefaultDriverName,
		CertDir:                  "/tmp/k8s-webhook-server/serving-certs",
		CertName:                 "tls.crt",
		KeyName:                  "tls.key",
		Port:                     9443,
		HealthProbeBindAddress:   ":8081",
		MetricsBindAddress:       ":8080",
		Timeouts:                 DefaultTimeouts(),
		MaxRequestsInFlight:      DefaultMaxRequestsInFlight,
		MaxHandshakesPerSecond:   DefaultHandshakesPerSecond,
		ShutdownDelay:            DefaultShutdownDelay,
		MaxTemplatesPerNamespace: podinject.DefaultMaxTemplatesPerNamespace,
		Namespace:                cliflag.PodNamespace(),
	}
}

// AddFlags registers the flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.DriverName, "driver-name", o.DriverName, "DRA driver name; also the attribute domain and the default DeviceClass name")
	fs.StringVar(&o.NodeGroupsFile, "node-groups", o.NodeGroupsFile, "node-groups file (YAML) shared with the kubelet plugin; empty means "+nodegroups.DefaultGroupDescription)
	fs.StringVar(&o.CertDir, "cert-dir", o.CertDir, "directory with the serving certificate and key; reloaded when the files change")
	fs.StringVar(&o.CertName, "cert-name", o.CertName, "serving certificate file name in --cert-dir")
	fs.StringVar(&o.KeyName, "key-name", o.KeyName, "serving key file name in --cert-dir")
	fs.StringVar(&o.Host, "host", o.Host, "address the webhook server binds to; empty means all addresses")
	fs.IntVar(&o.Port, "port", o.Port, "port of the webhook server")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", o.HealthProbeBindAddress, "address of the probe endpoints /healthz and /readyz (0 disables)")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "address of the Prometheus endpoint /metrics (0 disables)")
	fs.DurationVar(&o.Resync, "resync-period", o.Resync, "informer resync period (0 disables resyncs)")
	fs.IntVar(&o.MaxRequestsInFlight, "max-requests-in-flight", o.MaxRequestsInFlight, "most requests the webhook server handles at once; the others wait for a place as long as the API server waits for them")
	fs.IntVar(&o.MaxConnections, "max-connections", o.MaxConnections, fmt.Sprintf("most client connections the webhook server has open at once, at least --max-requests-in-flight (0: that and %d more, for the API servers' idle connections); further ones wait in the listen queue until one closes, so that a backlog of reviews does not cost a TLS handshake each", idleRoom))
	fs.IntVar(&o.MaxHandshakesPerSecond, "max-handshakes-per-second", o.MaxHandshakesPerSecond, "most new client connections the webhook server takes into a TLS handshake a second (as many at once); further ones wait in the listen queue, and those whose client gave up meanwhile are dropped unhandshaken")
	fs.DurationVar(&o.ShutdownDelay, "shutdown-delay", o.ShutdownDelay, "after SIGTERM, how long to report not ready and keep serving before shutting down, so that the Service's endpoints drop this replica first (the pod's terminationGracePeriodSeconds must exceed it)")
	cliflag.List(fs, "excluded-namespaces", "comma-separated namespaces the webhook configurations' namespaceSelector excludes; pod reviews for them are denied, nothing is created there", func(namespaces []string) error {
		o.ExcludedNamespaces = namespaces
		return nil
	})
	fs.IntVar(&o.MaxTemplatesPerNamespace, "max-templates-per-namespace", o.MaxTemplatesPerNamespace, "most managed ResourceClaimTemplates pod injection creates in one namespace (one per distinct count, model and memory asked for); a pod needing one more is denied")
	cliflag.List(fs, "device-classes", "comma-separated DeviceClasses of the chart, each NAME or NAME=EXTENDED_RESOURCE_NAME (its spec.extendedResourceName); the first serves the pod annotations (default: --driver-name, no extended resource name)", func(classes []string) error {
		o.DeviceClasses = nil
		for _, c := range classes {
			name, resource, _ := strings.Cut(c, "=")
			o.DeviceClasses = append(o.DeviceClasses, podinject.DeviceClass{Name: name, ExtendedResourceName: corev1.ResourceName(resource)})
		}
		return nil
	})
	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "the webhook's namespace, where it probes what the API server serves with dry-run requests (default $POD_NAMESPACE)")
	cliflag.List(fs, "deny", "comma-separated rules that deny instead of warn: "+strings.Join(claimvalidation.RuleNames(), ", "), func(names []string) error {
		rules, err := claimvalidation.ParseRules(strings.Join(names, ","))
		if err != nil {
			return err
		}
		o.Deny = rules
		return nil
	})
}

// Validate checks the options before anything starts and reports every problem at once, each
// naming its flag.
func (o *Options) Validate() error {
	errs := []error{
		deviceschema.ValidateDriverName("--driver-name", o.DriverName),
		cliflag.ValidateBindAddress("--health-probe-bind-address", o.HealthProbeBindAddress),
		cliflag.ValidateBindAddress("--metrics-bind-address", o.MetricsBindAddress),
	}
	if o.Namespace == "" {
		errs = append(errs, errors.New("--namespace: required (default $POD_NAMESPACE); set it to the webhook's namespace"))
	}
	if o.MaxTemplatesPerNamespace < 1 {
		errs = append(errs, fmt.Errorf("--max-templates-per-namespace=%d: use at least 1, e.g. %d", o.MaxTemplatesPerNamespace, podinject.DefaultMaxTemplatesPerNamespace))
	}
	if o.MaxRequestsInFlight < 1 || o.MaxRequestsInFlight > maxMaxRequestsInFlight {
		errs = append(errs, fmt.Errorf("--max-requests-in-flight=%d: use 1..%d, e.g. %d", o.MaxRequestsInFlight, maxMaxRequestsInFlight, DefaultMaxRequestsInFlight))
	}
	if o.MaxConnections != 0 && (o.MaxConnections < o.MaxRequestsInFlight || o.MaxConnections > maxMaxConnections) {
		errs = append(errs, fmt.Errorf("--max-connections=%d: use 0 (--max-requests-in-flight and %d) or %d..%d", o.MaxConnections, idleRoom, o.MaxRequestsInFlight, maxMaxConnections))
	}
	if o.MaxHandshakesPerSecond < 1 || o.MaxHandshakesPerSecond > maxHandshakesPerSecond {
		errs = append(errs, fmt.Errorf("--max-handshakes-per-second=%d: use 1..%d, e.g. %d", o.MaxHandshakesPerSecond, maxHandshakesPerSecond, DefaultHandshakesPerSecond))
	}
	if o.ShutdownDelay < 0 || o.ShutdownDelay > maxShutdownDelay {
		errs = append(errs, fmt.Errorf("--shutdown-delay=%s: use 0s..%s, e.g. %s", o.ShutdownDelay, maxShutdownDelay, DefaultShutdownDelay))
	}
	if o.Port <= 0 || o.Port > 65535 {
		errs = append(errs, fmt.Errorf("--port=%d: not a port; use 1..65535, e.g. 9443", o.Port))
	}
	for _, c := range o.DeviceClasses {
		if c.Name == "" {
			errs = append(errs, fmt.Errorf("--device-classes: an entry has no class name; give NAME or NAME=EXTENDED_RESOURCE_NAME"))
		}
		if c.ExtendedResourceName != "" {
			if err := podinject.ValidateExtendedResourceName(c.ExtendedResourceName); err != nil {
				errs = append(errs, fmt.Errorf("--device-classes: %s=%s: %w", c.Name, c.ExtendedResourceName, err))
			}
		}
	}
	return errors.Join(errs...)
}

// maxConnections is MaxConnections with 0 resolved.
func (o *Options) maxConnections() int {
	if o.MaxConnections == 0 {
		return o.MaxRequestsInFlight + idleRoom
	}
	return o.MaxConnections
}
