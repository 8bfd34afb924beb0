package inventory

import (
	"context"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// maxReservedKept bounds the consumers kept of a claim: they only name who holds its devices in
// messages, which list a few (a claim may be reserved for up to 256 pods).
const maxReservedKept = 4

// Claims caches every ResourceClaim's allocation (in whichever resource.k8s.io version the server
// serves, converted to v1), so that a claim can be judged against what the others leave free.
type Claims struct {
	informer cache.SharedIndexInformer
}

// claimsPageSize is the page of the claim informer's initial list: a page is decoded whole before
// it is transformed, a megabyte at 500 claims of 2 KB.
const claimsPageSize = 500

// NewClaims prepares the informer; onChange runs after every add and delete, and after an update
// that changed what is kept of the claim (TransformClaim). RBAC: resource.k8s.io resourceclaims
// list, watch in all namespaces.
func NewClaims(cs kubernetes.Interface, resync time.Duration, onChange func()) *Claims {
	dra := draclient.New(cs)
	c := &Claims{informer: cache.NewSharedIndexInformer(PlainListWatch(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return listClaims(ctx, o, dra.ResourceClaims("").List)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := dra.ResourceClaims("").Watch(ctx, o)
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, transformClaimEvent), nil
		},
	}), &resourceapi.ResourceClaim{}, resync, nil)}
	changed := func() {
		if onChange != nil {
			onChange()
		}
	}
	_, _ = c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { changed() },
		UpdateFunc: func(oldObj, newObj any) {
			// A resync, or a write of what the transform dropped (the plugin's status.devices,
			// labels), changes no allocation: the answers found against them stay good.
			if !sameKeptClaim(oldObj, newObj) {
				changed()
			}
		},
		DeleteFunc: func(any) { changed() },
	})
	return c
}

// listClaims is the claim informer's list: in pages (ListInPages), each transformed as it arrives,
// so that a restart never holds every claim decoded at once.
func listClaims(ctx context.Context, o metav1.ListOptions, list func(context.Context, metav1.ListOptions) (*resourceapi.ResourceClaimList, error)) (*resourceapi.ResourceClaimList, error) {
	out := &resourceapi.ResourceClaimList{}
	err := ListInPages(ctx, o, claimsPageSize, list, func(page *resourceapi.ResourceClaimList) {
		for i := range page.Items {
			out.Items = append(out.Items, *transformClaim(&page.Items[i]))
		}
		out.TypeMeta, out.ResourceVersion = page.TypeMeta, page.ResourceVersion
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// transformClaimEvent transforms the claim of a watch event (a bookmark's too: the informer
// expects one type); errors pass unchanged.
func transformClaimEvent(e watch.Event) (watch.Event, bool) {
	switch e.Type {
	case watch.Added, watch.Modified, watch.Deleted, watch.Bookmark:
		if c, ok := e.Object.(*resourceapi.ResourceClaim); ok {
			e.Object = transformClaim(c)
		}
	}
	return e, true
}

// sameKeptClaim: two states of a claim as cached keep the same allocation and consumers.
func sameKeptClaim(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*resourceapi.ResourceClaim)
	n, ok2 := newObj.(*resourceapi.ResourceClaim)
	return ok1 && ok2 && o.UID == n.UID && apiequality.Semantic.DeepEqual(o.Status, n.Status)
}

// TransformClaim keeps of a claim what the allocator's state and the messages about holders read:
// its name, namespace and UID, and of its status the allocation's device results (without their
// config, tolerations and binding conditions) and the first few consumers. A claim's spec, its
// opaque config and its devices' status can be kilobytes each; a cluster has a claim per GPU pod.
// For the fleet metrics' pending claims it also keeps the creation time and, while the claim has
// no allocation, the Pod that controls it (a claim made from a pod's template). Anything but a
// *ResourceClaim passes through (tombstones).
func TransformClaim(obj any) (any, error) {
	c, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		return obj, nil
	}
	return transformClaim(c), nil
}

func transformClaim(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	out := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace, UID: c.UID, ResourceVersion: c.ResourceVersion,
		CreationTimestamp: c.CreationTimestamp}}
	if c.Status.Allocation == nil {
		if owner := metav1.GetControllerOfNoCopy(c); owner != nil && owner.APIVersion == "v1" && owner.Kind == "Pod" {
			out.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}
		}
	}
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
	return out
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
