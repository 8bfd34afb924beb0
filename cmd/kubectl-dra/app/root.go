// Package app implements the `kubectl dra` commands: upgrade (rewrite resource.k8s.io manifests
// for another API version), validate (the webhook's claim checks, without admission), status
// (every GPU and who holds it), why (what keeps a claim from its devices), fault (simulated
// GPU faults: set, clear, list), preflight (what a control-plane upgrade would break) and migrate
// (store every resource.k8s.io object again in the API server's storage version).
package app

import (
	"errors"
	"flag"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/klog/v2"
)

// Exit codes.
const (
	// ExitFailed: a document could not be processed, or the command line is wrong.
	ExitFailed = 1
	// ExitDenied: validate found an object the webhook would deny.
	ExitDenied = 2
)

// exitError carries an exit code through cobra after the message has been printed.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// ExitCode maps the error Execute returned to the process exit code.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	return ExitFailed
}

// NewCommand returns the `kubectl dra` command tree.
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	flags := genericclioptions.NewConfigFlags(true)
	root := &cobra.Command{
		Use:   "kubectl-dra",
		Short: "Upgrade, validate and explain Dynamic Resource Allocation manifests and GPUs",
		Long: `kubectl dra works with the gpu-dra driver's claims and GPUs:

  upgrade   rewrite ResourceClaimTemplates, ResourceClaims and DeviceClasses for the
            resource.k8s.io version a cluster serves
  validate  run the gpu-dra webhook's checks on them, offline (CI pipelines) or against a
            cluster's ResourceSlices and DeviceClasses
  status    show every GPU: model, memory, health, and the claim and pod holding it
  why       explain why a pod or ResourceClaim gets no devices
  fault     inject, clear or list simulated GPU faults
  preflight tell whether upgrading the control plane to a Kubernetes release breaks DRA
  migrate   store every resource.k8s.io object again in the API server's storage version,
            before an upgrade to a release that no longer reads older versions`,
		SilenceUsage: true,
		Annotations: map[string]string{
			cobra.CommandDisplayNameAnnotation: "kubectl dra",
		},
	}
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	// Only the connection flags: namespaces come from the manifests.
	root.PersistentFlags().StringVar(flags.KubeConfig, "kubeconfig", "", "path to the kubeconfig file (default $KUBECONFIG or ~/.kube/config)")
	root.PersistentFlags().StringVar(flags.Context, "context", "", "kubeconfig context to use")
	root.PersistentFlags().StringVar(flags.Timeout, "request-timeout", clusterTimeout.String(), "how long to wait for one request to the API server (a list is one request a page); 0: no bound")
	// Of klog's flags only the verbosity: the plugin logs to standard error and nowhere else.
	logFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(logFlags)
	root.PersistentFlags().AddGoFlag(logFlags.Lookup("v"))
	root.AddCommand(newUpgradeCommand(streams, flags), newValidateCommand(streams, flags), newStatusCommand(streams, flags), newWhyCommand(streams, flags), newFaultCommand(streams, flags),
		newPreflightCommand(streams, flags), newMigrateCommand(streams, flags))
	return root
}

// exit returns an error that cobra prints as the last line and that ends the process with code.
func exit(code int, format string, args ...any) error {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...)}
}
