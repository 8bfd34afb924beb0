package inventory

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ListPage is one page of a list: the typed lists of client-go are.
type ListPage interface {
	GetContinue() string
}

// ListInPages lists in pages of pageSize, handing each page to each as it arrives, so that a
// caller keeping less than whole objects never holds more than one page of them decoded. A single
// list (what an informer asks for, served whole from the API server's cache) would be every object
// decoded at once next to what is kept of them. The pages are read at one resourceVersion, the
// latest: never older than what the informer asked for.
func ListInPages[L ListPage](ctx context.Context, o metav1.ListOptions, pageSize int64, list func(context.Context, metav1.ListOptions) (L, error), each func(L)) error {
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
