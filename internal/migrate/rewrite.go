package migrate

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
)

// outcome of one object's rewrite.
type outcome int

const (
	rewritten outcome = iota
	unchanged
	gone
	failed
)

// maxExpired bounds how often a listing goes on after its page token expired.
const maxExpired = 3

// tally adds the outcomes of concurrent rewrites to a Result.
type tally struct {
	mu sync.Mutex
	r  *Result
}

func (t *tally) add(o outcome, obj *unstructured.Unstructured, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch o {
	case rewritten:
		t.r.Rewritten++
	case unchanged:
		t.r.Unchanged++
	case gone:
		t.r.Gone++
	case failed:
		t.r.Failed++
		if len(t.r.Errors) < maxErrors {
			t.r.Errors = append(t.r.Errors, fmt.Sprintf("%s: %v", objectName(obj), err))
		}
	}
}

func objectName(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns + "/" + obj.GetName()
	}
	return obj.GetName()
}

// rewrite lists the resource page by page and updates every object unchanged, at most
// concurrency at a time, adding the outcomes to r.
func (m *Migrator) rewrite(ctx context.Context, gvr schema.GroupVersionResource, r *Result) error {
	client := m.client.Resource(gvr)
	t := &tally{r: r}
	expired := 0
	for cont := ""; ; {
		rctx, cancel := context.WithTimeout(ctx, m.o.requestTimeout)
		list, err := client.List(rctx, metav1.ListOptions{Limit: m.o.pageSize, Continue: cont})
		cancel()
		if err != nil {
			// The page token expires with etcd's compaction (5 minutes): go on from the newest
			// state when the API server offers a token for it. Objects are then listed at a later
			// revision, which is as good for a rewrite.
			next, ok := inconsistentContinue(err)
			if cont == "" || !ok || expired >= maxExpired {
				return fmt.Errorf("list %s: %w", gvr.Resource, err)
			}
			cont = next
			expired++
			continue
		}
		r.Objects += len(list.Items)
		var g errgroup.Group
		g.SetLimit(m.o.concurrency)
		for i := range list.Items {
			obj := &list.Items[i]
			g.Go(func() error {
				o, err := m.rewriteOne(ctx, client.Namespace(obj.GetNamespace()), obj)
				t.add(o, obj, err)
				return nil
			})
		}
		_ = g.Wait()
		if err := ctx.Err(); err != nil {
			return err
		}
		m.o.progress(gvr.Resource, fmt.Sprintf("%d listed, %d rewritten, %d unchanged, %d gone, %d failed",
			r.Objects, r.Rewritten, r.Unchanged, r.Gone, r.Failed))
		if cont = list.GetContinue(); cont == "" {
			return nil
		}
	}
}

// inconsistentContinue is the token the API server offers along with an expired one.
func inconsistentContinue(err error) (string, bool) {
	var status apierrors.APIStatus
	if !apierrors.IsResourceExpired(err) || !errors.As(err, &status) {
		return "", false
	}
	c := status.Status().Continue
	return c, c != ""
}

// rewriteOne updates obj as read; on a conflict it reads the object again and retries. The
// API server stores the update only when the encoding differs, i.e. when the object was in
// another version than the storage version: a new resourceVersion says it did.
func (m *Migrator) rewriteOne(ctx context.Context, client dynamic.ResourceInterface, obj *unstructured.Unstructured) (outcome, error) {
	logger := klog.FromContext(ctx)
	opts := metav1.UpdateOptions{}
	if m.o.dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	current, result := obj, outcome(failed)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if current == nil {
			rctx, cancel := context.WithTimeout(ctx, m.o.requestTimeout)
			fresh, err := client.Get(rctx, obj.GetName(), metav1.GetOptions{})
			cancel()
			if err != nil {
				return err
			}
			current = fresh
		}
		rctx, cancel := context.WithTimeout(ctx, m.o.requestTimeout)
		updated, err := client.Update(rctx, current, opts)
		cancel()
		if apierrors.IsConflict(err) {
			logger.V(4).Info("Conflict, reading the object again", "object", objectName(obj))
			current = nil
		}
		if err != nil {
			return err
		}
		result = unchanged
		if m.o.dryRun || updated.GetResourceVersion() != current.GetResourceVersion() {
			result = rewritten
		}
		return nil
	})
	switch {
	case apierrors.IsNotFound(err):
		return gone, nil
	case err != nil:
		return failed, err
	}
	return result, nil
}
