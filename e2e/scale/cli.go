package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// CLIOptions configure RunCLI: kubectl dra status and why against a kube-apiserver of its own
// (envtest's etcd and kube-apiserver) holding a fleet and its claims, no webhook, no controllers.
type CLIOptions struct {
	// Assets holds etcd and kube-apiserver of the release to measure.
	Assets string
	// RuntimeConfig is kube-apiserver's --runtime-config, FeatureGates its --feature-gates; empty
	// serves the release's defaults. The fleet is written as resource.k8s.io/v1 (1.34 or later).
	RuntimeConfig, FeatureGates string
	// EtcdDir keeps the fleet between runs: a second run with the same directory skips the
	// writing. Empty: a temporary directory.
	EtcdDir     string
	ChartRender string
	NodeGroups  string
	WorkDir     string
	Nodes       int
	// Claims is the fraction of the fleet's GPUs held by allocated claims, one GPU each.
	Claims  float64
	Workers int
	// KubectlDra are the binaries timed, each run going through all of them in turn, so that
	// two builds are compared on the same server minutes apart at most.
	KubectlDra []string
	Runs       int
}

// Validate bounds every count and names the flag to fix.
func (o *CLIOptions) Validate() error {
	var errs []error
	if o.Assets == "" {
		errs = append(errs, errors.New("--baseline-assets: want the directory of etcd and kube-apiserver of the release to measure"))
	}
	if o.Nodes < 1 || o.Nodes > maxNodes {
		errs = append(errs, fmt.Errorf("--nodes=%d: want one size in 1..%d", o.Nodes, maxNodes))
	}
	if o.Runs < 1 || o.Runs > 20 {
		errs = append(errs, fmt.Errorf("--cli-runs=%d: want 1..20", o.Runs))
	}
	if len(o.KubectlDra) == 0 || len(o.KubectlDra) > 4 {
		errs = append(errs, fmt.Errorf("--kubectl-dra=%v: want one to four binaries, comma-separated", o.KubectlDra))
	}
	if o.Workers < 1 || o.Workers > 256 {
		errs = append(errs, fmt.Errorf("--workers=%d: want 1..256", o.Workers))
	}
	return errors.Join(errs...)
}

// RunCLI fills its own control plane with o.Nodes nodes' slices and the held claims (the
// generators of Run), creates the pending pod of the claims phase and times kubectl dra status
// and why with each binary, o.Runs rounds, writing the times to out.
func RunCLI(ctx context.Context, o CLIOptions, out io.Writer) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		return err
	}
	env := &envtest.Environment{BinaryAssetsDirectory: o.Assets, ControlPlane: envtest.ControlPlane{
		APIServer: &envtest.APIServer{}, Etcd: &envtest.Etcd{DataDir: o.EtcdDir}}}
	if o.RuntimeConfig != "" {
		env.ControlPlane.GetAPIServer().Configure().Set("runtime-config", o.RuntimeConfig)
	}
	if o.FeatureGates != "" {
		env.ControlPlane.GetAPIServer().Configure().Set("feature-gates", o.FeatureGates)
	}
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("control plane (--baseline-assets=%s): %w", o.Assets, err)
	}
	defer func() { _ = env.Stop() }()
	cfg.QPS, cfg.Burst = 1e5, 1e5
	kubeconfig := filepath.Join(o.WorkDir, "kubeconfig")
	if err := writeKubeconfig(cfg, kubeconfig); err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if err := fillCLI(ctx, cs, o); err != nil {
		return err
	}
	return timeCLI(ctx, o, kubeconfig, out)
}

// fillCLI writes the fleet and the claims unless an earlier run left them in o.EtcdDir.
func fillCLI(ctx context.Context, cs kubernetes.Interface, o CLIOptions) error {
	if _, err := cs.CoreV1().Pods(loadNamespace).Get(ctx, whyPod, metav1.GetOptions{}); err == nil {
		return nil
	}
	ch, driver, err := writeFleet(ctx, cs, o.NodeGroups, o.ChartRender, o.Workers, o.Nodes)
	if err != nil {
		return err
	}
	devices, err := listDevices(ctx, cs, driver)
	if err != nil {
		return err
	}
	claims, err := claimsFor(o.Claims, len(devices))
	if err != nil {
		return err
	}
	h := &holder{cs: cs, driver: driver, class: ch.classes[0].Name, workers: o.Workers, devices: spread(devices), claims: claims}
	if err := h.write(ctx); err != nil {
		return err
	}
	_, err = createPendingPod(ctx, cs, ch.classes[0].Name)
	return err
}

// timeCLI times status and why with every binary, round by round, and prints each binary's
// wall and CPU times and peak RSS per command, with the machine's load before and after.
func timeCLI(ctx context.Context, o CLIOptions, kubeconfig string, out io.Writer) error {
	commands := cliCommands
	runs := make([][][]cliRun, len(o.KubectlDra))
	for b := range runs {
		runs[b] = make([][]cliRun, len(commands))
	}
	before := machine()
	for range o.Runs {
		for b, bin := range o.KubectlDra {
			ob := Options{KubectlDra: bin, Kubeconfig: kubeconfig, WorkDir: filepath.Join(o.WorkDir, fmt.Sprintf("bin-%d", b))}
			if err := os.MkdirAll(ob.WorkDir, 0o755); err != nil {
				return err
			}
			for c, args := range commands {
				before := childrenCPU()
				r, err := runKubectlDra(ctx, ob, args...)
				if err != nil {
					return err
				}
				r.ServerCPU = childrenCPU() - before
				runs[b][c] = append(runs[b][c], r)
			}
		}
	}
	fmt.Fprintf(out, "Machine: %s before, %s after.\n\n", before, machine())
	fmt.Fprintf(out, "| kubectl-dra | `kubectl dra status` | its CPU | API server's CPU | its peak RSS | `kubectl dra why pod/%s` | its CPU | API server's CPU | its peak RSS |\n|---|---|---|---|---|---|---|---|---|\n", whyPod)
	for b, bin := range o.KubectlDra {
		fmt.Fprintf(out, "| %s |", bin)
		for c := range commands {
			var wall, cpu, server []time.Duration
			rss := int64(0)
			for _, r := range runs[b][c] {
				wall, cpu, server, rss = append(wall, r.Wall), append(cpu, r.CPU), append(server, r.ServerCPU), max(rss, r.MaxRSS)
			}
			fmt.Fprintf(out, " %s | %s | %s | %.0f MiB |", secondsRange(wall), secondsRange(cpu), secondsRange(server), mib(rss))
		}
		fmt.Fprintln(out)
	}
	return nil
}

// childrenCPU is the CPU time (user and system) of this process's children that are running:
// envtest's etcd and kube-apiserver.
func childrenCPU() time.Duration {
	procs, err := processes()
	if err != nil {
		return 0
	}
	self := strconv.Itoa(os.Getpid())
	var n int64
	for _, p := range procs {
		if p.ppid == self {
			n += p.ticks
		}
	}
	return ticks(n)
}

// secondsRange is the fastest, median and slowest of ds.
func secondsRange(ds []time.Duration) string {
	s := slices.Sorted(slices.Values(ds))
	return fmt.Sprintf("%.2f / %.2f / %.2f s (min / median / max of %d)", s[0].Seconds(), s[len(s)/2].Seconds(), s[len(s)-1].Seconds(), len(s))
}

// writeFleet creates the chart's DeviceClasses and n nodes with their slices, from the node groups
// and the chart render at the given paths; it returns the chart and the driver's name.
func writeFleet(ctx context.Context, cs kubernetes.Interface, nodeGroups, chartRender string, workers, n int) (*chart, string, error) {
	groups, err := nodegroups.LoadConfig(nodeGroups)
	if err != nil {
		return nil, "", fmt.Errorf("--node-groups: %w", err)
	}
	ch, err := readChart(chartRender)
	if err != nil {
		return nil, "", err
	}
	if err := ch.createClasses(ctx, cs); err != nil {
		return nil, "", err
	}
	driver := ch.classes[0].Name
	inv := &inventory{cs: cs, groups: groups, driver: driver, workers: workers}
	if err := inv.grow(ctx, 0, n); err != nil {
		return nil, "", err
	}
	return ch, driver, nil
}
