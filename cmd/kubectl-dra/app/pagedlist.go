package app

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/pager"
)

// Page sizes: how many objects one list request asks for. Each page costs the API server a walk of
// its watch cache and the client a round trip, so a list of 40,000 claims in pages of 500 (80
// pages) took 18 s where pages of 5,000 (8 pages) take 2 to 5 s. What bounds a page is its size
// in memory, decoded, while the next one is read: 5,000 claims (as keptClaim keeps them, an
// allocation each) or 5,000 nodes' names and labels are a few megabytes, where 500 slices of 8
// GPUs are about ten: slices go 1,000 at a time. The rest (classes, taint rules) are few and go
// in pages of listPageSize.
const (
	listPageSize   = 500
	claimsPageSize = 5000
	nodesPageSize  = 5000
	slicesPageSize = 1000
)

// listInPages lists in pages of opts.Limit (listPageSize if unset) with client-go's pager, handing
// each object to each and counting the pages on p. start runs before the first page and again if
// the list starts over, so that what each gathered can be dropped. Each page is let go once each
// has seen its objects (each keeps what status and why read, not the object), and the pager
// fetches the next page only once the last one is handed over: at most two pages are held decoded.
//
// Which resourceVersion: none (""), the consistent read, with a limit. From 1.34 on
// (ListFromCacheSnapshot, beta and on by default) the API server serves such a list from its watch
// cache, the first page once the cache has caught up with etcd and every further page from the
// cache's snapshot at the first page's revision; before that (1.32, 1.33) the server reads each
// page from etcd, one bounded range read, as `kubectl get` does. resourceVersion "0" would be
// served from the cache on every release, but the cache ignores the limit with it (through 1.37):
// one response holding every claim, the request this tool must not make on a large cluster.
//
// A continue token expires when the revision it reads at is compacted (etcd) or has left the
// cache's snapshots: the server answers 410 Gone. The list then starts over once, at the newest
// revision, and p says so; a second expiry is an error.
func listInPages(ctx context.Context, p *progress, what string, opts metav1.ListOptions, list pager.ListPageFunc, start func(), each func(runtime.Object) error) (int, error) {
	n := 0
	pg := pager.New(func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		obj, err := list(ctx, o)
		if err == nil {
			p.page(what, meta.LenList(obj))
		}
		return obj, err
	})
	if opts.Limit <= 0 {
		opts.Limit = listPageSize
	}
	pg.PageSize = opts.Limit
	pg.PageBufferSize = 0
	opts.ResourceVersion, opts.ResourceVersionMatch, opts.Continue = "", "", ""
	for restarted := false; ; restarted = true {
		n = 0
		start()
		err := pg.EachListItem(ctx, opts, func(obj runtime.Object) error {
			n++
			return each(obj)
		})
		if err == nil || restarted || !isExpired(err) {
			return n, err
		}
		p.restart(what, err)
	}
}

// isExpired tells an expired continue token: 410 Gone, reason Expired.
func isExpired(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}

// keptSlice is what status and why read of a ResourceSlice: its spec and its name. Its
// managedFields (a field set per device) are as large as the devices.
func keptSlice(s *resourceapi.ResourceSlice) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		TypeMeta:   s.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, UID: s.UID, ResourceVersion: s.ResourceVersion, Generation: s.Generation, Labels: s.Labels},
		Spec:       s.Spec,
	}
}

// keptNode is a Node's name and labels, all the allocator and a node selector read.
func keptNode(m *metav1.PartialObjectMetadata) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: m.Name, Labels: m.Labels, UID: m.UID}}
}
