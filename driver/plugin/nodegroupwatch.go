package plugin

import (
	"context"
	"reflect"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// Publisher publishes the node's pool; the kubeletplugin helper implements it.
type Publisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// NodeGroupWatcher re-publishes when what the node should have changes: its labels (which pick
// the node group) or the inventory file (a ConfigMap the chart mounts, updated in place by the
// kubelet). The Node is watched, not polled, so a large cluster does not pay per node per interval;
// the file is re-read every Interval because ConfigMap volume updates swap symlinks, which file
// watches miss.
type NodeGroupWatcher struct {
	NodeName   string
	ConfigPath string
	Interval   time.Duration
	Client     kubernetes.Interface
	Driver     *Driver
	Publisher  Publisher
	// Current is the spec already published, as configured (before Sharing).
	Current nodegroups.GroupSpec
	// Sharing turns a sharing mode the API server does not keep into exclusive; nil publishes
	// every mode as configured.
	Sharing *SharingGate
	// Taints, when set, is asked every ProbeInterval whether the API server now keeps device
	// taints (it re-publishes by itself).
	Taints *TaintingPublisher
	// ProbeInterval is how often, with 20% jitter so that a fleet's plugins do not ask at once,
	// the API server is asked again what it serves (default 30s): a control-plane upgrade turns
	// features on under the running plugin.
	ProbeInterval time.Duration
	// Published, when set, is told each spec published, as published (after Sharing).
	Published func(nodegroups.GroupSpec)
}

// probeJitter spreads a fleet's re-probes: each plugin waits ProbeInterval times 1 to 1.2.
const probeJitter = 0.2

// Run blocks until ctx is canceled.
func (w *NodeGroupWatcher) Run(ctx context.Context) {
	trigger := make(chan struct{}, 1)
	lister := w.watchNode(ctx, func() {
		select {
		case trigger <- struct{}{}:
		default:
		}
	})
	interval := w.Interval
	if interval <= 0 {
		interval = 10 * time.Second
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	probeEvery := w.ProbeInterval
	if probeEvery <= 0 {
		probeEvery = 30 * time.Second
	}
	reprobe := time.NewTimer(wait.Jitter(probeEvery, probeJitter))
	defer reprobe.Stop()
	// servedChanged: what the API server serves changed since the last successful publish.
	servedChanged := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-trigger:
		case <-reprobe.C:
			servedChanged = w.reprobe(ctx) || servedChanged
			reprobe.Reset(wait.Jitter(probeEvery, probeJitter))
		}
		if w.apply(ctx, lister, servedChanged) {
			servedChanged = false
		}
	}
}

// watchNode runs an informer of this node alone, calling poke when its labels change.
func (w *NodeGroupWatcher) watchNode(ctx context.Context, poke func()) corelisters.NodeLister {
	// One informer for one node, not a SharedInformerFactory: the factory links every API
	// group's informers and listers into the binary (14 MB of it).
	nodes := coreinformers.NewFilteredNodeInformer(w.Client, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.FieldSelector = "metadata.name=" + w.NodeName
	})
	_, _ = nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { poke() },
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Node)
			n, ok2 := newObj.(*corev1.Node)
			if !ok1 || !ok2 || !reflect.DeepEqual(o.Labels, n.Labels) {
				poke()
			}
		},
	})
	go nodes.RunWithContext(ctx)
	return corelisters.NewNodeLister(nodes.GetIndexer())
}

// apply re-publishes the node's devices when its group's spec changed or servedChanged, and
// reports whether what is published is now current (nothing to do counts as current).
func (w *NodeGroupWatcher) apply(ctx context.Context, lister corelisters.NodeLister, servedChanged bool) bool {
	logger := klog.FromContext(ctx)
	node, err := lister.Get(w.NodeName)
	if err != nil {
		return false // not synced yet
	}
	cfg, err := nodegroups.LoadConfig(w.ConfigPath)
	if err != nil {
		// Keep publishing what we have; a broken edit must not take the node's GPUs away.
		logger.Error(err, "Inventory config unreadable; keeping the published devices", "path", w.ConfigPath)
		return false
	}
	group, spec := cfg.GroupFor(node.Labels)
	if specEqual(spec, w.Current) && !servedChanged {
		return true
	}
	publish := spec
	if w.Sharing != nil {
		publish = w.Sharing.Effective(ctx, group, spec)
	}
	source := simulated.New(w.NodeName, publish)
	if err := w.Driver.SetDevices(ctx, source); err != nil {
		logger.Error(err, "Inventory change not applied")
		return false
	}
	resources, err := Resources(ctx, w.NodeName, source, w.Sharing.Layout())
	if err == nil {
		err = w.Publisher.PublishResources(ctx, resources)
	}
	if err != nil {
		logger.Error(err, "Re-publishing after inventory change failed")
		return false
	}
	logger.Info("Inventory changed; re-published", "count", spec.Count, "model", spec.Model, "memory", spec.Memory.String(), "sharing", publish.ModeOf())
	w.Current = spec
	if w.Published != nil {
		w.Published(publish)
	}
	return true
}

// reprobe asks the API server again what it serves and reports whether the node's sharing must
// be re-published.
func (w *NodeGroupWatcher) reprobe(ctx context.Context) bool {
	if w.Taints != nil {
		if err := w.Taints.Refresh(ctx); err != nil {
			klog.FromContext(ctx).V(2).Info("Re-probing device taints failed; asking again later", "err", err)
		}
	}
	return w.Sharing.Refresh(ctx)
}

// specEqual compares quantities by value, not by how they were written.
func specEqual(a, b nodegroups.GroupSpec) bool {
	return equality.Semantic.DeepEqual(a, b)
}
