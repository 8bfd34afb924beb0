// Package server wires the admission handlers into a controller-runtime manager: the TLS webhook
// server (certificates reloaded from CertDir when they change), health and readiness probes,
// Prometheus metrics and the inventory informers.
package server

import (
	"cmp"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/flagalias"
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
		MaxTemplatesPerNamespace: podinject.DefaultMaxTemplatesPerNamespace,
		Namespace:                cmp.Or(os.Getenv("POD_NAMESPACE"), "default"),
	}
}

// AddFlags registers the flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.DriverName, "driver-name", o.DriverName, "DRA driver name; also the attribute domain and the default DeviceClass name")
	fs.StringVar(&o.NodeGroupsFile, "node-groups", o.NodeGroupsFile, "node-groups file (YAML) shared with the kubelet plugin; empty means 8 GPUs per node")
	flagalias.Deprecated(fs, "inventory-config", "node-groups")
	fs.StringVar(&o.CertDir, "cert-dir", o.CertDir, "directory with the serving certificate and key; reloaded when the files change")
	fs.StringVar(&o.CertName, "cert-name", o.CertName, "serving certificate file name in --cert-dir")
	fs.StringVar(&o.KeyName, "key-name", o.KeyName, "serving key file name in --cert-dir")
	fs.StringVar(&o.Host, "host", o.Host, "address the webhook server binds to (empty: all)")
	fs.IntVar(&o.Port, "port", o.Port, "port of the webhook server")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", o.HealthProbeBindAddress, "address of /healthz and /readyz")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "address of /metrics (0 disables)")
	fs.DurationVar(&o.Resync, "resync-period", o.Resync, "informer resync period (0: none)")
	fs.Func("excluded-namespaces", "comma-separated namespaces the webhook configurations' namespaceSelector excludes; pod reviews for them are denied, nothing is created there", func(s string) error {
		for ns := range strings.SplitSeq(s, ",") {
			if ns = strings.TrimSpace(ns); ns != "" {
				o.ExcludedNamespaces = append(o.ExcludedNamespaces, ns)
			}
		}
		return nil
	})
	fs.IntVar(&o.MaxTemplatesPerNamespace, "max-templates-per-namespace", o.MaxTemplatesPerNamespace, "most managed ResourceClaimTemplates pod injection creates in one namespace (one per distinct count, model and memory asked for); a pod needing one more is denied")
	fs.Func("device-class", "a DeviceClass of the chart as NAME or NAME=EXTENDED_RESOURCE_NAME (its spec.extendedResourceName); repeat for each, the first serves the pod annotations (default: --driver-name, no extended resource name)", func(s string) error {
		name, resource, _ := strings.Cut(s, "=")
		o.DeviceClasses = append(o.DeviceClasses, podinject.DeviceClass{Name: name, ExtendedResourceName: corev1.ResourceName(resource)})
		return nil
	})
	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "the webhook's namespace, where it probes what the API server serves with dry-run requests ($POD_NAMESPACE when set)")
	fs.Func("deny", "comma-separated rules that deny instead of warn: "+strings.Join(claimvalidation.RuleNames(), ", "), func(s string) error {
		rules, err := claimvalidation.ParseRules(s)
		if err != nil {
			return err
		}
		o.Deny = append(o.Deny, rules...)
		return nil
	})
	for _, r := range claimvalidation.Rules {
		fs.BoolFunc("deny-"+string(r), fmt.Sprintf("deny instead of warn for rule %s (same as --deny=%s)", r, r), func(s string) error {
			if s == "true" {
				o.Deny = append(o.Deny, r)
			} else if s != "false" {
				return fmt.Errorf("want true or false, got %q", s)
			}
			return nil
		})
	}
}

// Validate checks the options before anything starts.
func (o *Options) Validate() error {
	if o.DriverName == "" {
		return fmt.Errorf("--driver-name: required, e.g. gpu.example.com")
	}
	if o.MaxTemplatesPerNamespace < 1 {
		return fmt.Errorf("--max-templates-per-namespace: %d; use at least 1, e.g. %d", o.MaxTemplatesPerNamespace, podinject.DefaultMaxTemplatesPerNamespace)
	}
	if o.Port <= 0 || o.Port > 65535 {
		return fmt.Errorf("--port: %d is not a port; use 1..65535, e.g. 9443", o.Port)
	}
	for _, c := range o.DeviceClasses {
		if c.ExtendedResourceName != "" {
			if err := podinject.ValidateExtendedResourceName(c.ExtendedResourceName); err != nil {
				return fmt.Errorf("--device-class=%s=%s: %w", c.Name, c.ExtendedResourceName, err)
			}
		}
	}
	return nil
}
