package scale

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/plugin"
	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// GroupLabel is the node label the node-groups file of the harness selects groups by.
const GroupLabel = "scale.gpu-dra.io/group"

// kwokAnnotation makes kwok manage a node: mark it Ready, renew its lease, run its pods.
const kwokAnnotation = "kwok.x-k8s.io/node"

// groupOf spreads the nodes over the groups: of every 10 nodes, 6 default, 3 h200, 1 l4.
func groupOf(i int) string {
	switch i % 10 {
	case 6, 7, 8:
		return "h200"
	case 9:
		return "l4"
	}
	return ""
}

// NodeName names the i-th fake node.
func NodeName(i int) string { return fmt.Sprintf("scale-node-%05d", i) }

// inventory creates fake nodes and publishes their ResourceSlices.
type inventory struct {
	cs      kubernetes.Interface
	groups  *nodegroups.Config
	driver  string
	workers int
	// kwokNodes are the first nodes, the ones kwok manages (the scheduling phase's).
	kwokNodes int
}

// grow creates nodes [from, to) and publishes their slices.
func (inv *inventory) grow(ctx context.Context, from, to int) error {
	logger := klog.FromContext(ctx)
	start := time.Now()
	var done atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(inv.workers)
	for i := from; i < to; i++ {
		g.Go(func() error {
			if err := inv.addNode(gctx, i); err != nil {
				return err
			}
			if n := done.Add(1); n%500 == 0 {
				logger.Info("Nodes published", "done", n, "of", to-from, "elapsed", time.Since(start).Round(time.Second))
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	logger.Info("Nodes and slices published", "nodes", to-from, "total", to, "elapsed", time.Since(start).Round(time.Millisecond))
	return nil
}

func (inv *inventory) addNode(ctx context.Context, i int) error {
	name := NodeName(i)
	labels := map[string]string{corev1.LabelHostname: name, "type": "kwok"}
	if g := groupOf(i); g != "" {
		labels[GroupLabel] = g
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if i < inv.kwokNodes {
		node.Annotations = map[string]string{kwokAnnotation: "fake"}
	}
	resources := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	node.Status = corev1.NodeStatus{Capacity: resources, Allocatable: resources}
	created, err := inv.cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	return inv.publish(ctx, created)
}

// publish publishes the node's devices the way the kubelet plugin does for its own node: the
// devices of its group (simulated.New), one pool (plugin.Resources), the DRA library's
// ResourceSlice controller with the Node as owner. The controller stops once the slice is stored:
// nothing changes afterwards, and 5,000 idle controllers would only hold 5,000 watches.
func (inv *inventory) publish(ctx context.Context, node *corev1.Node) error {
	_, spec := inv.groups.GroupFor(node.Labels)
	// The fleet's node groups share no counters (no partitioned group), so the layout is moot.
	resources, err := plugin.Resources(ctx, node.Name, simulated.New(node.Name, spec), plugin.CountersInOwnSlices)
	if err != nil {
		return err
	}
	failed := make(chan error, 1)
	ctrl, err := resourceslice.StartController(ctx, resourceslice.Options{
		DriverName: inv.driver,
		KubeClient: inv.cs,
		Owner:      &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID},
		Resources:  &resources,
		ErrorHandler: func(_ context.Context, err error, msg string) {
			select {
			case failed <- fmt.Errorf("node %s: %s: %w", node.Name, msg, err):
			default:
			}
		},
	})
	if err != nil {
		return fmt.Errorf("node %s: %w", node.Name, err)
	}
	defer ctrl.Stop()
	return poll(ctx, 2*time.Minute, "slice of node "+node.Name, func() (bool, error) {
		select {
		case err := <-failed:
			return false, err
		default:
		}
		return ctrl.GetStats().NumCreates > 0, nil
	})
}
