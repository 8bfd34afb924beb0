// Command gpu-webhook serves the admission webhooks of the gpu.example.com DRA driver.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager/signals"

	"github.com/gpu-dra/gpu-dra/certs"
	"github.com/gpu-dra/gpu-dra/webhook/server"
)

func main() {
	opts := server.NewOptions()
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	klog.InitFlags(fs)
	opts.AddFlags(fs)
	certOpts := certs.NewOptions()
	certOpts.AddFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	logger := klog.Background()
	log.SetLogger(logger)
	ctx := klog.NewContext(signals.SetupSignalHandler(), logger)

	cfg, err := config.GetConfig()
	if err != nil {
		logger.Error(err, "Loading kubeconfig failed")
		os.Exit(1)
	}
	runner, err := server.NewRunner(cfg, opts)
	if err != nil {
		logger.Error(err, "Creating the webhook failed")
		os.Exit(1)
	}
	// The webhook server cannot start before its certificate is on disk.
	syncer, err := certs.Setup(ctx, cfg, certOpts, opts.CertDir)
	if err != nil {
		logger.Error(err, "Preparing serving certificates failed")
		os.Exit(1)
	}
	if syncer != nil {
		runner.Add(syncer)
	}
	if err := server.Setup(runner, opts); err != nil {
		logger.Error(err, "Setting up webhooks failed")
		os.Exit(1)
	}
	logger.Info("Starting gpu-webhook", "driver", opts.DriverName, "port", opts.Port, "deny", opts.Deny)
	if err := server.Run(ctx, runner, opts); err != nil {
		logger.Error(err, "Webhook server stopped")
		os.Exit(1)
	}
}
