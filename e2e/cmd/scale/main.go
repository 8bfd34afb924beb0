// Command scale runs `make scale`: the webhook and kubectl dra against a fleet of fake GPU nodes on
// a local control plane (see package e2e/scale). hack/scale.sh starts the control plane and passes
// the binaries.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/e2e/scale"
)

// intList parses comma-separated integers into *into.
func intList(into *[]int) func(string) error {
	return func(s string) error {
		*into = nil
		for f := range strings.SplitSeq(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				return err
			}
			*into = append(*into, n)
		}
		return nil
	}
}

func main() {
	o := scale.Options{Nodes: []int{1, 100, 1000, 5000}, Rate: 200, HighRate: 1000, Duration: 10 * time.Second,
		SchedNodes: 1000, SchedPods: 1000, Workers: 32, GOGC: "100", GOMemLimit: "off", WorkDir: "_output/scale",
		Claims: 1, ClaimsRates: []int{1000, 2000}, ChurnRate: 100, ReviewDeadline: 100 * time.Millisecond}
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	klog.InitFlags(fs)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "the control plane's kubeconfig")
	fs.StringVar(&o.ChartRender, "chart-render", "charts/charttest/testdata/k8s-1.34.golden", "rendered chart whose classes, webhook configurations and webhook flags are used")
	fs.StringVar(&o.NodeGroups, "node-groups", "e2e/scale/testdata/node-groups.yaml", "node-groups file of the fake fleet (plugin and webhook)")
	fs.StringVar(&o.Webhook, "webhook", "_output/bin/gpu-webhook", "gpu-webhook binary")
	fs.StringVar(&o.KubectlDra, "kubectl-dra", "_output/bin/kubectl-dra", "kubectl-dra binary (empty: no status timing)")
	fs.StringVar(&o.Kwok, "kwok", "", "kwok binary (empty: no scheduling phase)")
	fs.StringVar(&o.KwokStages, "kwok-stages", "", "directory of the sigs.k8s.io/kwok module, whose stages kwok runs")
	fs.StringVar(&o.BaselineAssets, "baseline-assets", os.Getenv("KUBEBUILDER_ASSETS"), "directory of etcd and kube-apiserver of the cluster's release, for the 1-node baseline webhook's control plane")
	fs.StringVar(&o.WorkDir, "work-dir", o.WorkDir, "certificates, logs and the report")
	fs.StringVar(&o.GOGC, "webhook-gogc", o.GOGC, "GOGC of the webhook process")
	fs.BoolVar(&o.PauseControllers, "pause-controllers", true, "stop the controller-manager and the scheduler (SIGSTOP) during the loads sent straight to the webhook, whose latency they would share two CPUs with")
	fs.StringVar(&o.GOMemLimit, "webhook-gomemlimit", o.GOMemLimit, "GOMEMLIMIT of the webhook process (the chart sets its memory limit, 256MiB by default)")
	fs.Func("nodes", "comma-separated fleet sizes, ascending (default 1,100,1000,5000)", intList(&o.Nodes))
	fs.IntVar(&o.Rate, "rate", o.Rate, "template and pod reviews per second in every phase")
	fs.IntVar(&o.HighRate, "high-rate", o.HighRate, "template reviews per second at the smallest and largest fleet (0: skip)")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "length of each load")
	fs.IntVar(&o.SchedNodes, "sched-nodes", o.SchedNodes, "fleet size (one of --nodes) whose nodes kwok runs and at which --sched-pods pods are placed")
	fs.IntVar(&o.SchedPods, "sched-pods", o.SchedPods, "annotated pods created at --rate in the scheduling phase (0: skip)")
	fs.IntVar(&o.Workers, "workers", o.Workers, "nodes created and published, claims written, at once")
	fs.Float64Var(&o.Claims, "claims", o.Claims, "fraction of the largest fleet's GPUs held by allocated claims, one GPU each, while the claims loads run (0: skip)")
	fs.Func("claims-rates", "comma-separated rates of template and pod reviews straight to the webhook at the largest fleet, with the claims held and against --upstream-webhook (default 1000,2000)", intList(&o.ClaimsRates))
	fs.IntVar(&o.ChurnRate, "claims-churn", o.ChurnRate, "allocations changed per second while template reviews run at the first claims rate (0: skip)")
	fs.DurationVar(&o.ReviewDeadline, "review-deadline", o.ReviewDeadline, "what a template review should stay within while the claims change")
	var mo scale.MemoryOptions
	fs.Func("memory-webhooks", "comma-separated gpu-webhook binaries: measure only their memory at the largest of --nodes, on a control plane of its own from --baseline-assets, round by round (no --kubeconfig needed)", func(s string) error {
		mo.Webhooks = strings.Split(s, ",")
		return nil
	})
	fs.IntVar(&mo.Rounds, "memory-rounds", 3, "rounds of --memory-webhooks")
	fs.Func("memory-measure", "what the --memory-webhooks rounds measure, comma-separated: idle (no claims, against --upstream-webhook), claims (memory with --claims held), churn (template review latency while the claims change at --claims-churn), stall (template reviews at the top --claims-rates, no claims, each webhook and the upstream one stopped for --memory-stall during the load); default all", func(s string) error {
		mo.Measure = strings.Split(s, ",")
		return nil
	})
	fs.IntVar(&mo.NodeWrites, "memory-node-writes", 0, "Node status writes a second during the --memory-webhooks rounds without claims, one node after another, as a fleet's kubelets make them (0: none)")
	fs.DurationVar(&mo.Stall, "memory-stall", 100*time.Millisecond, "how long each webhook is stopped (SIGSTOP) during the stall load of --memory-measure")
	fs.Func("memory-gomemlimits", "comma-separated GOMEMLIMIT of each --memory-webhooks binary where the chart's applies (empty entry: the chart's)", func(s string) error {
		mo.GOMemLimits = strings.Split(s, ",")
		return nil
	})
	fs.StringVar(&o.Upstream, "upstream-webhook", "", "dra-example-webhook binary (kubernetes-sigs/dra-example-driver) compared with ours at the largest fleet (empty: skip)")
	cliOnly := fs.Bool("cli-only", false, "only time kubectl dra status and why, on a kube-apiserver of its own (--baseline-assets) holding the largest of --nodes and --claims; --kubectl-dra may name several binaries, comma-separated, timed in turn")
	cliRuns := fs.Int("cli-runs", 5, "with --cli-only: rounds of status and why per binary")
	cliEtcd := fs.String("cli-etcd-dir", "", "with --cli-only: etcd data directory kept between runs, so that a second run skips writing the fleet (empty: a temporary one)")
	runtimeConfig := fs.String("runtime-config", "", "with --cli-only: kube-apiserver's --runtime-config (the fleet is written as resource.k8s.io/v1: 1.34 or later)")
	featureGates := fs.String("feature-gates", "", "with --cli-only: kube-apiserver's --feature-gates")
	if err := fs.Parse(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx = klog.NewContext(ctx, klog.Background())
	if *cliOnly {
		co := scale.CLIOptions{Assets: o.BaselineAssets, RuntimeConfig: *runtimeConfig, FeatureGates: *featureGates, EtcdDir: *cliEtcd, ChartRender: o.ChartRender,
			NodeGroups: o.NodeGroups, WorkDir: o.WorkDir, Nodes: o.Nodes[len(o.Nodes)-1], Claims: o.Claims, Workers: o.Workers,
			KubectlDra: strings.Split(o.KubectlDra, ","), Runs: *cliRuns}
		if err := scale.RunCLI(ctx, co, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "scale:", err)
			os.Exit(1)
		}
		return
	}
	run := func() error { return scale.Run(ctx, o, os.Stdout) }
	if len(mo.Webhooks) > 0 {
		run = func() error { return scale.Memory(ctx, o, mo, os.Stdout) }
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}
