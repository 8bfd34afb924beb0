// Package listing lists Kubernetes objects for informers that keep less than whole objects: in
// pages, each page handed on as it arrives, through a plain list and watch.
package listing

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// Page is one page of a list: the typed lists of client-go are.
type Page interface {
	GetContinue() string
}

// InPages lists in pages of pageSize, handing each page to each as it arrives, so that a caller
// keeping less than whole objects never holds more than one page of them decoded. A single list
// (what an informer asks for, served whole from the API server's cache) would be every object
// decoded at once next to what is kept of them. The pages are read at one resourceVersion, the
// latest: never older than what the informer asked for.
func InPages[L Page](ctx context.Context, o metav1.ListOptions, pageSize int64, list func(context.Context, metav1.ListOptions) (L, error), each func(L)) error {
	o.ResourceVersion, o.ResourceVersionMatch, o.Limit, o.Continue = "", "", pageSize, ""
	for {
		page, err := list(ctx, o)
		if err != nil {
			return err
		}
		each(page)
		if page.GetContinue() == "" {
			return nil
		}
		o.Continue = page.GetContinue()
	}
}

// Plain is lw opted out of watch-list streaming, so that the informer lists through lw's list
// function (paged by InPages) and then watches: the initial-events bookmark of a streamed list
// would also have to survive what lw does to the objects (a version conversion, a transform).
func Plain(lw *cache.ListWatch) cache.ListerWatcher { return plain{lw} }

type plain struct{ *cache.ListWatch }

func (plain) IsWatchListSemanticsUnSupported() bool { return true }
