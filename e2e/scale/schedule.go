package scale

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// schedResult is the scheduling phase: SchedPods annotated pods created (for real) at Rate on
// SchedNodes kwok nodes.
type schedResult struct {
	Create                   *result
	Admitted, Allocated, Run int
	// ToRunning is from the first create to the last pod Running; ToAllocated to the last claim
	// allocated.
	ToRunning, ToAllocated time.Duration
}

// kwokStageFiles are kwok's own stages (from its module): nodes become Ready and keep a lease,
// pods on them become Running, deleted pods go.
var kwokStageFiles = []string{
	"kustomize/stage/node/fast/node-initialize.yaml",
	"kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
	"kustomize/stage/pod/fast/pod-ready.yaml",
	"kustomize/stage/pod/fast/pod-complete.yaml",
	"kustomize/stage/pod/fast/pod-delete.yaml",
}

// startKwok runs kwok for the nodes the inventory annotated, with its stages from stageDir (the
// sigs.k8s.io/kwok module directory).
func startKwok(ctx context.Context, o Options) (*exec.Cmd, error) {
	var cfg []byte
	for _, f := range kwokStageFiles {
		data, err := os.ReadFile(filepath.Join(o.KwokStages, f))
		if err != nil {
			return nil, fmt.Errorf("--kwok-stages: %w", err)
		}
		cfg = append(append(cfg, "---\n"...), data...)
	}
	path := filepath.Join(o.WorkDir, "kwok.yaml")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(o.WorkDir, "kwok.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(o.Kwok, "--kubeconfig", o.Kubeconfig, "--config", path,
		"--manage-nodes-with-annotation-selector", kwokAnnotation+"=fake", "--cidr", "10.64.0.0/12", "--node-ip", "10.63.0.1")
	cmd.Stdout, cmd.Stderr = log, log
	klog.FromContext(ctx).Info("Starting kwok", "args", cmd.Args, "log", log.Name())
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start kwok: %w", err)
	}
	return cmd, nil
}

// schedule runs the scheduling phase on the first nodes nodes.
func schedule(ctx context.Context, o Options, cs kubernetes.Interface, l *loader, nodes int) (*schedResult, error) {
	logger := klog.FromContext(ctx)
	kwok, err := startKwok(ctx, o)
	if err != nil {
		return nil, err
	}
	defer func() { _ = kwok.Process.Kill(); _ = kwok.Wait() }()
	if err := poll(ctx, 5*time.Minute, fmt.Sprintf("%d kwok nodes Ready and untainted", nodes), func() (bool, error) {
		list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, nil
		}
		ready := 0
		for i := range list.Items {
			n := &list.Items[i]
			if n.Annotations[kwokAnnotation] == "fake" && nodeReady(n) && len(n.Spec.Taints) == 0 {
				ready++
			}
		}
		return ready >= nodes, nil
	}); err != nil {
		return nil, err
	}
	r := &schedResult{}
	start := time.Now()
	r.Create = drive(ctx, "pod creation", o.Rate, o.SchedPods, func(ctx context.Context, i int) error {
		_, err := cs.CoreV1().Pods(loadNamespace).Create(ctx, l.pod(fmt.Sprintf("sched-%05d", i)), metav1.CreateOptions{})
		return err
	})
	logger.Info("Scheduling phase", "result", r.Create.String())
	r.Admitted = len(r.Create.Lat)
	err = poll(ctx, 10*time.Minute, "pods Running", func() (bool, error) {
		pods, err := cs.CoreV1().Pods(loadNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=scale"})
		if err != nil {
			return false, nil
		}
		claims, err := cs.ResourceV1().ResourceClaims(loadNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		r.Run, r.Allocated = 0, 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				r.Run++
			}
		}
		for _, c := range claims.Items {
			if c.Status.Allocation != nil {
				r.Allocated++
			}
		}
		if r.Allocated >= r.Admitted && r.ToAllocated == 0 {
			r.ToAllocated = time.Since(start)
		}
		logger.V(2).Info("Scheduling", "running", r.Run, "allocated", r.Allocated, "admitted", r.Admitted)
		return r.Run >= r.Admitted, nil
	})
	r.ToRunning = time.Since(start)
	if err != nil {
		return r, fmt.Errorf("%w (%d of %d pods Running, %d claims allocated)", err, r.Run, r.Admitted, r.Allocated)
	}
	logger.Info("Scheduling phase done", "running", r.Run, "allocated", r.Allocated, "toRunning", r.ToRunning, "toAllocated", r.ToAllocated)
	// The pods go before the next phase, so that it measures the webhook, not their deletion.
	if err := cs.CoreV1().Pods(loadNamespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "app=scale"}); err != nil {
		return r, err
	}
	err = poll(ctx, 5*time.Minute, "pods deleted", func() (bool, error) {
		pods, err := cs.CoreV1().Pods(loadNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=scale", Limit: 1})
		return err == nil && len(pods.Items) == 0, nil
	})
	return r, err
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
