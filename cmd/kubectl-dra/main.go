// Command kubectl-dra is the `kubectl dra` plugin: it upgrades resource.k8s.io manifests between
// API versions, runs the gpu-dra admission checks offline or against a cluster, shows the fleet's
// GPUs and why a pod waits, and injects simulated faults.
package main

import (
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/gpu-dra/gpu-dra/cmd/kubectl-dra/app"
)

func main() {
	cmd := app.NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	os.Exit(app.ExitCode(cmd.Execute()))
}
