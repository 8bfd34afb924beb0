package inventory

import (
	"context"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/klog/v2"
)

// maxReservedKept bounds the consumers kept of a claim: they only name who holds its devices in
// messages, which list a few (a claim may be reserved for up to 256 pods).
const maxReservedKept = 4

// Claims caches every ResourceClaim's allocation (in whichever resource.k8s.io version the server
// serves, converted to v1), so that a claim can be judged against what the others leave free.
type Claims struct {
	informer cache.SharedIndexInformer
}

// NewClaims prepares the informer; onChange runs after every add, update or delete. RBAC:
// resource.k8s.io resourceclaims list, watch in all namespaces.
func NewClaims(cs kubernetes.Interface, resync time.Duration, onChange func()) *Claims {
	dra := draclient.New(cs)
	c := &Claims{informer: cache.NewSharedIndexInformer(PlainListWatch(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return dra.ResourceClaims("").List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return dra.ResourceClaims("").Watch(ctx, o)
		},
	}), &resourceapi.ResourceClaim{}, resync, nil)}
	// Transforms are set before the informer runs, so setting one cannot fail.
	_ = c.informer.SetTransform(TransformClaim)
	changed := func() {
		if onChange != nil {
			onChange()
		}
	}
	_, _ = c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { changed() },
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*resourceapi.ResourceClaim)
			n, ok2 := newObj.(*resourceapi.ResourceClaim)
			// A resync, or a change of what the transform dropped, changes no allocation.
			if !ok1 || !ok2 || o.ResourceVersion != n.ResourceVersion {
				changed()
			}
		},
		DeleteFunc: func(any) { changed() },
	})
	return c
}

// TransformClaim keeps of a claim what the allocator's state and the messages about holders read:
// its name, namespace and UID, and of its status the allocation's device results (without their
// config, tolerations and binding conditions) and the first few consumers. A claim's spec, its
// opaque config and its devices' status can be kilobytes each; a cluster has a claim per GPU pod.
// Anything but a *ResourceClaim passes through (tombstones).
func TransformClaim(obj any) (any, error) {
	c, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		return obj, nil
	}
	out := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace, UID: c.UID, ResourceVersion: c.ResourceVersion}}
	if a := c.Status.Allocation; a != nil {
		results := make([]resourceapi.DeviceRequestAllocationResult, 0, len(a.Devices.Results))
		for _, r := range a.Devices.Results {
			results = append(results, resourceapi.DeviceRequestAllocationResult{Request: r.Request, Driver: r.Driver, Pool: r.Pool, Device: r.Device,
				AdminAccess: r.AdminAccess, ShareID: r.ShareID, ConsumedCapacity: r.ConsumedCapacity})
		}
		out.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
		reserved := c.Status.ReservedFor[:min(len(c.Status.ReservedFor), maxReservedKept)]
		for _, r := range reserved {
			out.Status.ReservedFor = append(out.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{APIGroup: r.APIGroup, Resource: r.Resource, Name: r.Name})
		}
	}
	return out, nil
}

// Start runs the informer until ctx ends.
func (c *Claims) Start(ctx context.Context) {
	klog.FromContext(ctx).V(2).Info("Starting ResourceClaim informer")
	go c.informer.RunWithContext(ctx)
}

// HasSynced reports whether the initial list is in the cache.
func (c *Claims) HasSynced() bool { return c.informer.HasSynced() }

// Claims lists the cached claims, or fails with ErrNotSynced until HasSynced.
func (c *Claims) Claims() ([]*resourceapi.ResourceClaim, error) {
	if !c.HasSynced() {
		return nil, ErrNotSynced
	}
	return list[resourceapi.ResourceClaim](c.informer), nil
}
