package podinject

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"regexp"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/listing"
)

// The managed-template informer selects by label, and anyone who may create a template can set the
// label, also on templates of other drivers, which never pass this webhook. Kept whole, a few
// hundred such templates of a megabyte each would exhaust the webhook's memory, and again at every
// restart. So the informer keeps only templates named as the webhook names them, and of those only
// what EnsureTemplate reads: namespace, name and a digest of the spec.

// templateDigest is what the informer keeps of a managed template.
type templateDigest struct {
	// ObjectMeta holds the namespace, name and resourceVersion, nothing else.
	metav1.ObjectMeta
	// Spec is specDigest of the template's spec.
	Spec [sha256.Size]byte
}

// GetObjectKind makes templateDigest a runtime.Object; it carries no type information.
func (t *templateDigest) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject makes templateDigest a runtime.Object.
func (t *templateDigest) DeepCopyObject() runtime.Object {
	out := &templateDigest{Spec: t.Spec}
	t.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return out
}

// templateDigestList is the informer's list.
type templateDigestList = inventory.CompactList[templateDigest, *templateDigest]

// specDigest is the SHA-256 of a template spec's JSON. encoding/json writes struct fields in
// declaration order and map keys sorted, and quantities in their canonical form, so the same spec
// always digests the same.
func specDigest(spec *resourceapi.ResourceClaimTemplateSpec) ([sha256.Size]byte, error) {
	canonical, err := json.Marshal(spec)
	if err != nil {
		return [sha256.Size]byte{}, fmt.Errorf("hash template spec: %w", err)
	}
	return sha256.Sum256(canonical), nil
}

// managedName matches the names managedTemplate gives: the claim name, the GPU count and the
// first hashLength hex digits of the spec's digest.
var managedName = regexp.MustCompile(fmt.Sprintf(`^%s-[0-9]+-[0-9a-f]{%d}$`, regexp.QuoteMeta(ClaimName), hashLength))

// digestTemplate is what the informer keeps of t, or nil for a template the webhook cannot have
// made: one that is not named as it names them. A template of ours that does not carry the label
// (a watch that ignores the label selector, client-go's fake) is kept too; unlabelled reports that.
func digestTemplate(t *resourceapi.ResourceClaimTemplate) (d *templateDigest, unlabelled bool) {
	if !managedName.MatchString(t.Name) {
		return nil, false
	}
	d = &templateDigest{ObjectMeta: metav1.ObjectMeta{Namespace: t.Namespace, Name: t.Name, ResourceVersion: t.ResourceVersion}}
	// An unencodable spec keeps the zero digest, which no spec the webhook writes has.
	d.Spec, _ = specDigest(&t.Spec)
	return d, t.Labels[ManagedByLabel] != ManagedBy
}

// templatePageSize is the page of the informer's list. A page is decoded whole before it is
// digested, and a template can be as large as the API server stores (about 1.5 MB): a page costs
// at most a few tens of megabytes however large the templates someone labelled are.
const templatePageSize = 20

// listDigests is the informer's list: in pages (listing.InPages), each digested as it
// arrives.
func listDigests(ctx context.Context, o metav1.ListOptions, list func(context.Context, metav1.ListOptions) (*resourceapi.ResourceClaimTemplateList, error)) (*templateDigestList, error) {
	out := &templateDigestList{}
	err := listing.InPages(ctx, o, templatePageSize, list, func(page *resourceapi.ResourceClaimTemplateList) {
		for i := range page.Items {
			if d, unlabelled := digestTemplate(&page.Items[i]); d != nil && !unlabelled {
				out.Items = append(out.Items, d)
			}
		}
		out.ResourceVersion = page.ResourceVersion
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// digestEvent digests the template of a watch event, drops the events of templates the webhook
// cannot have made, and turns a template that lost the label into a deletion. A bookmark becomes
// an empty templateDigest with its resourceVersion: the informer expects one type. Errors pass.
func digestEvent(e watch.Event) (watch.Event, bool) {
	switch e.Type {
	case watch.Added, watch.Modified, watch.Deleted:
		t, ok := e.Object.(*resourceapi.ResourceClaimTemplate)
		if !ok {
			return e, true
		}
		d, unlabelled := digestTemplate(t)
		if d == nil {
			return e, false
		}
		if unlabelled {
			e.Type = watch.Deleted
		}
		e.Object = d
	case watch.Bookmark:
		if a, err := meta.Accessor(e.Object); err == nil {
			e.Object = &templateDigest{ObjectMeta: metav1.ObjectMeta{ResourceVersion: a.GetResourceVersion(), Annotations: a.GetAnnotations()}}
		}
	}
	return e, true
}
