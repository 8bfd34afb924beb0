package inventory

import (
	"context"
	"slices"
	"time"
	"unique"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
	"github.com/gpu-dra/gpu-dra/internal/listing"
	"github.com/gpu-dra/gpu-dra/internal/reflected"
)

// maxReservedKept bounds the consumers kept of a claim: they only name who holds its devices in
// messages, which list a few (a claim may be reserved for up to 256 pods).
const maxReservedKept = 4

// Claims caches every ResourceClaim's allocation (in whichever resource.k8s.io version the server
// serves, converted to v1), so that a claim can be judged against what the others leave free.
type Claims struct {
	cache *reflected.Cache
}

// claimsPageSize is the page of the claim informer's initial list: a page is decoded whole before
// it is transformed, a megabyte at 500 claims of 2 KB.
const claimsPageSize = 500

// NewClaims prepares the informer; onChange runs after every add and delete, and after an update
// that changed what is kept of the claim (TransformClaim). RBAC: resource.k8s.io resourceclaims
// list, watch in all namespaces.
func NewClaims(cs kubernetes.Interface, resync time.Duration, onChange func()) *Claims {
	dra := draclient.New(cs)
	if onChange == nil {
		onChange = func() {}
	}
	// A resync, or a write of what the transform dropped (the plugin's status.devices, labels),
	// changes no allocation: the answers found against them stay good (sameKeptClaim).
	return &Claims{cache: reflected.New("ResourceClaims", listing.Plain(&cache.ListWatch{
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
	}), &Claim{}, reflected.WithHandler(changes(onChange, sameKeptClaim)), reflected.WithResyncPeriod(resync))}
}

// listClaims is the claim informer's list: in pages (listing.InPages), each transformed as it arrives,
// so that a restart never holds every claim decoded at once.
func listClaims(ctx context.Context, o metav1.ListOptions, list func(context.Context, metav1.ListOptions) (*resourceapi.ResourceClaimList, error)) (*ClaimList, error) {
	out := &ClaimList{}
	err := listing.InPages(ctx, o, claimsPageSize, list, func(page *resourceapi.ResourceClaimList) {
		for i := range page.Items {
			out.Items = append(out.Items, transformClaim(&page.Items[i]))
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
	o, ok1 := oldObj.(*Claim)
	n, ok2 := newObj.(*Claim)
	return ok1 && ok2 && o.meta().sameUID(n.meta()) && apiequality.Semantic.DeepEqual(o.Claim, n.Claim)
}

// Claim is a ResourceClaim as the claims informer keeps it: what a fleet reads of it
// (deviceusage.Claim: the allocation's device results without their config, tolerations and
// binding conditions, and the first few consumers), its UID and resourceVersion. A cluster has a
// claim per GPU pod: as a transformed ResourceClaim each took about 800 bytes in seven objects,
// 300 of them structs that are empty here, and every claim its own copy of the driver, pool and
// device names, which are interned here.
type Claim struct {
	deviceusage.Claim
	// ids are the uid and the resourceVersion as Meta keeps them (Meta.ids), in the one
	// allocation that holds the claim's name and its consumers' names too: decoded, each is an
	// allocation of its own, and a UID's 36 bytes take 48.
	ids string
	// Created is the creation time in Unix nanoseconds (0: not set), for the fleet metrics'
	// pending claims.
	Created int64
	// PodOwned: the claim has no allocation and a Pod controls it (a claim made from a pod's
	// template), which the fleet metrics tell pending claims by.
	PodOwned bool
}

// GetObjectKind makes Claim a runtime.Object; it carries no type information.
func (c *Claim) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject makes Claim a runtime.Object; the consumed capacities are shared and read-only,
// as in the cache.
func (c *Claim) DeepCopyObject() runtime.Object {
	out := *c
	out.Results = slices.Clone(c.Results)
	out.ReservedFor = slices.Clone(c.ReservedFor)
	return &out
}

// GetObjectMeta is what the informer's key function and reflector read of the claim.
func (c *Claim) GetObjectMeta() metav1.Object {
	uid, rv, _ := c.meta().split()
	return &metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace, UID: uid, ResourceVersion: rv}
}

// UID is the claim's uid.
func (c *Claim) UID() types.UID { return c.meta().UID() }

// ResourceVersion is the claim's resourceVersion as listed or watched.
func (c *Claim) ResourceVersion() string { return c.meta().ResourceVersion() }

func (c *Claim) meta() *Meta { return &Meta{Name: c.Name, ids: c.ids} }

// ClaimList is a list of Claims, as the claims informer's list returns them.
type ClaimList = CompactList[Claim, *Claim]

// TransformClaim keeps of a claim what the allocator's state, the messages about holders and the
// fleet metrics read (Claim). Anything but a *ResourceClaim passes through (tombstones).
func TransformClaim(obj any) (any, error) {
	c, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		return obj, nil
	}
	return transformClaim(c), nil
}

// intern returns the canonical copy of s: the names that repeat across claims (namespace, driver,
// pool, device, request) are held once.
func intern(s string) string { return unique.Make(s).Value() }

// KeepClaim is c as the claims informer keeps it.
func KeepClaim(c *resourceapi.ResourceClaim) *Claim { return transformClaim(c) }

func transformClaim(c *resourceapi.ResourceClaim) *Claim {
	meta := newMeta(c.Name, c.UID, c.ResourceVersion, 0, nil)
	out := &Claim{ids: meta.ids}
	out.Name, out.Namespace = meta.Name, intern(c.Namespace)
	defer out.ownStrings()
	if !c.CreationTimestamp.IsZero() {
		out.Created = c.CreationTimestamp.UnixNano()
	}
	a := c.Status.Allocation
	if a == nil {
		owner := metav1.GetControllerOfNoCopy(c)
		out.PodOwned = owner != nil && owner.APIVersion == "v1" && owner.Kind == "Pod"
		return out
	}
	out.Allocated = true
	if len(a.Devices.Results) > 0 {
		out.Results = make([]deviceusage.Result, len(a.Devices.Results))
	}
	for i, r := range a.Devices.Results {
		out.Results[i] = deviceusage.Result{Request: intern(r.Request), Driver: intern(r.Driver), Pool: intern(r.Pool), Device: intern(r.Device),
			AdminAccess: r.AdminAccess != nil && *r.AdminAccess, ShareID: r.ShareID, ConsumedCapacity: r.ConsumedCapacity}
	}
	if n := min(len(c.Status.ReservedFor), maxReservedKept); n > 0 {
		out.ReservedFor = make([]resourceapi.ResourceClaimConsumerReference, n)
		for i, r := range c.Status.ReservedFor[:n] {
			out.ReservedFor[i] = resourceapi.ResourceClaimConsumerReference{APIGroup: intern(r.APIGroup), Resource: intern(r.Resource), Name: r.Name}
		}
	}
	return out
}

// ownStrings has the claim's name, ids and consumers' names share one allocation (oneString).
func (c *Claim) ownStrings() {
	var buf [2 + maxReservedKept]*string
	strs := append(buf[:0], &c.Name, &c.ids)
	for i := range c.ReservedFor {
		strs = append(strs, &c.ReservedFor[i].Name)
	}
	oneString(strs...)
}

// Start runs the informer until ctx ends.
func (c *Claims) Start(ctx context.Context) {
	klog.FromContext(ctx).V(2).Info("Starting ResourceClaim informer")
	go c.cache.Run(ctx)
}

// HasSynced reports whether the initial list is in the cache.
func (c *Claims) HasSynced() bool { return c.cache.HasSynced() }

// Claims lists the cached claims, or fails with ErrNotSynced until HasSynced.
func (c *Claims) Claims() ([]*Claim, error) {
	if !c.HasSynced() {
		return nil, ErrNotSynced
	}
	return list[Claim](c.cache.List()), nil
}
