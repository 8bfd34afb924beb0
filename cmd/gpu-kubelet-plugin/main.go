// Command gpu-kubelet-plugin is the node side of the gpu.example.com DRA driver: it registers with
// the kubelet, publishes the node's GPUs as ResourceSlices and prepares claims through CDI.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/app"
)

func main() {
	opts := app.NewOptions()
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	klog.InitFlags(fs)
	opts.AddFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	run := app.Run
	if opts.DeleteAllSlices {
		run = app.DeleteAllSlices
	}
	if err := run(ctx, *opts); err != nil {
		klog.Background().Error(err, "gpu-kubelet-plugin failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
