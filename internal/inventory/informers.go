package inventory

import (
	"context"
	"errors"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/internal/listing"
	"github.com/gpu-dra/gpu-dra/internal/reflected"
)

// Informers caches ResourceSlices (as Slices), DeviceClasses (in whichever resource.k8s.io version
// the server serves, converted to v1 by k8s.io/dynamic-resource-allocation/client) and Nodes
// (as Nodes: labels and some allocatable resources, decoded no further: nodeWire), each kind in a
// cache of its own (reflected). The resync period applies to the classes: a resync of the slices
// or nodes would rebuild the View's index for nothing.
type Informers struct {
	slices, classes, nodes *reflected.Cache
	onChange               func()
	interner               *Interner
}

// NewInformers prepares the informers; onChange runs after every add, update or delete (use it
// to invalidate a View). Of each Node's status.allocatable only the resources listed in
// keepAllocatable are kept (NodeAdvertising).
func NewInformers(cs kubernetes.Interface, resync time.Duration, onChange func(), keepAllocatable ...v1.ResourceName) *Informers {
	dra := draclient.New(cs)
	in := NewInterner()
	i := &Informers{onChange: onChange, interner: in}
	// Slices are transformed where they are read (listSlices, transformEvent), so that a list
	// never holds them decoded all at once.
	i.slices = reflected.New("ResourceSlices", in.sliceListWatch(dra.ResourceSlices().List, dra.ResourceSlices().Watch), &Slice{},
		reflected.WithSortedStore(), reflected.WithHandler(changes(i.changed, nil)))
	i.classes = reflected.New("DeviceClasses", listing.Plain(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return dra.DeviceClasses().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return dra.DeviceClasses().Watch(ctx, o)
		},
	}), &resourceapi.DeviceClass{}, reflected.WithTransform(TransformClass), reflected.WithSortedStore(),
		reflected.WithHandler(changes(i.changed, nil)), reflected.WithResyncPeriod(resync))
	// A cache of its own rather than from client-go's informer factory, which links an informer
	// and a lister of every built-in resource: 0.9 MB of type data, every page of it resident.
	// A node's status changes every few minutes (heartbeats, conditions) and, kept as a Node,
	// leaves nothing the checks read changed: such an update must not throw away the View's index
	// of thousands of nodes.
	i.nodes = reflected.New("Nodes", in.nodeListWatch(cs, keepOnly(keepAllocatable)), &Node{},
		reflected.WithSortedStore(),
		reflected.WithHandler(changes(i.changed, func(oldObj, newObj any) bool {
			o, ok1 := oldObj.(*Node)
			n, ok2 := newObj.(*Node)
			return ok1 && ok2 && sameNode(o, n)
		})))
	return i
}

// changes calls onChange on every add and delete, and on every update after which same (nil:
// never) does not find the object as kept unchanged.
func changes(onChange func(), same func(oldObj, newObj any) bool) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { onChange() },
		UpdateFunc: func(oldObj, newObj any) {
			if same == nil || !same(oldObj, newObj) {
				onChange()
			}
		},
		DeleteFunc: func(any) { onChange() },
	}
}

// sliceListWatch lists and watches ResourceSlices through list and watchSlices, as Slices: lists in
// pages (listSlices), each watch event transformed (transformEvent).
func (in *Interner) sliceListWatch(list func(context.Context, metav1.ListOptions) (*resourceapi.ResourceSliceList, error),
	watchSlices func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.ListerWatcher {
	return listing.Plain(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return in.listSlices(ctx, o, list)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := watchSlices(ctx, o)
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, in.transformEvent), nil
		},
	})
}

func (i *Informers) changed() {
	if i.onChange != nil {
		i.onChange()
	}
}

// DeviceClasses lists the cached DeviceClasses (nil until synced).
func (i *Informers) DeviceClasses() []*resourceapi.DeviceClass {
	if !i.classes.HasSynced() {
		return nil
	}
	return list[resourceapi.DeviceClass](i.classes.List())
}

// NodeAdvertising returns a node whose status.allocatable has more than zero of name (a device
// plugin advertises it), or "" for none. name must be one NewInformers was told to keep.
func (i *Informers) NodeAdvertising(name v1.ResourceName) string {
	for _, o := range i.nodes.List() {
		if n, ok := o.(*Node); ok {
			if q, ok := n.Allocatable[name]; ok && q.Sign() > 0 {
				return n.Name
			}
		}
	}
	return ""
}

// Start runs the informers until ctx ends.
func (i *Informers) Start(ctx context.Context) {
	klog.FromContext(ctx).V(2).Info("Starting inventory informers")
	go i.slices.Run(ctx)
	go i.classes.Run(ctx)
	go i.nodes.Run(ctx)
}

// HasSynced reports whether the initial lists are in the caches.
func (i *Informers) HasSynced() bool {
	return i.slices.HasSynced() && i.classes.HasSynced() && i.nodes.HasSynced()
}

func list[T any](objs []any) []*T {
	out := make([]*T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(*T); ok {
			out = append(out, t)
		}
	}
	return out
}

// KubeletBefore returns a node whose kubelet is older than release (e.g. 1.36), "" when there is
// none; a node that has not reported its kubelet's version yet does not count.
func (i *Informers) KubeletBefore(release *version.Version) string {
	for _, n := range list[Node](i.nodes.List()) {
		if v, err := version.ParseGeneric(n.KubeletVersion()); err == nil && v.LessThan(release) {
			return n.Name
		}
	}
	return ""
}

// ErrNotSynced is what Published returns before the initial lists are in: a DeviceClass missing
// from a half-filled cache is not missing from the cluster.
var ErrNotSynced = errors.New("inventory caches not synced yet")

// Published lists the cached objects, or fails with ErrNotSynced until HasSynced.
func (i *Informers) Published() (*Objects, error) {
	if !i.HasSynced() {
		return nil, ErrNotSynced
	}
	return &Objects{
		CompactSlices: list[Slice](i.slices.List()),
		Classes:       list[resourceapi.DeviceClass](i.classes.List()),
		CompactNodes:  list[Node](i.nodes.List()),
	}, nil
}

// What the caches keep must be reflected.Named.
var (
	_ reflected.Named = (*Slice)(nil)
	_ reflected.Named = (*Node)(nil)
	_ reflected.Named = (*resourceapi.DeviceClass)(nil)
)
