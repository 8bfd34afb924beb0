package scale

import (
	"context"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// writes counts the API server's writes to the objects the webhook keeps while one of its
// readings was taken. A webhook that holds a fleet takes in every write to a Node or a slice: a
// control plane still catching up with nodes just created (the node lifecycle controller
// tainting them) makes a reading of "the webhook without load" one under load, which the
// upstream webhook, holding nothing, does not see.
type writes struct {
	Nodes, Slices int
}

func (w writes) String() string {
	return fmt.Sprintf("%d Node and %d ResourceSlice writes", w.Nodes, w.Slices)
}

// activity is what went on in and around a webhook started for a reading of its memory.
type activity struct {
	// ToReady and Settled are the webhook's own CPU time until /readyz and from then to the
	// reading.
	ToReady, Settled time.Duration
	Writes           writes // from the webhook's start to the reading
}

func (a activity) String() string {
	return fmt.Sprintf("webhook CPU %.2f s until ready and %.2f s after, %s from its start to the reading",
		a.ToReady.Seconds(), a.Settled.Seconds(), a.Writes)
}

// writeCounter counts the writes its watches see.
type writeCounter struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	n      writes
}

// countWrites watches Nodes and ResourceSlices from now on, until Stop.
func countWrites(ctx context.Context, cs kubernetes.Interface) (*writeCounter, error) {
	ctx, cancel := context.WithCancel(ctx)
	c := &writeCounter{cancel: cancel}
	nodes, slices := cs.CoreV1().Nodes(), cs.ResourceV1().ResourceSlices()
	for _, w := range []struct {
		list  func(context.Context, metav1.ListOptions) (string, error)
		watch func(context.Context, metav1.ListOptions) (watch.Interface, error)
		count *int
	}{
		{resourceVersionOf(nodes.List), nodes.Watch, &c.n.Nodes},
		{resourceVersionOf(slices.List), slices.Watch, &c.n.Slices},
	} {
		// One object is enough to learn the resourceVersion to watch from.
		rv, err := w.list(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			c.Stop()
			return nil, fmt.Errorf("counting writes: %w", err)
		}
		events, err := w.watch(ctx, metav1.ListOptions{ResourceVersion: rv})
		if err != nil {
			c.Stop()
			return nil, fmt.Errorf("counting writes: %w", err)
		}
		c.wg.Go(func() { c.count(ctx, events, w.count) })
	}
	return c, nil
}

// resourceVersionOf is list returning only its list's resourceVersion.
func resourceVersionOf[L interface{ GetResourceVersion() string }](list func(context.Context, metav1.ListOptions) (L, error)) func(context.Context, metav1.ListOptions) (string, error) {
	return func(ctx context.Context, o metav1.ListOptions) (string, error) {
		l, err := list(ctx, o)
		if err != nil {
			return "", err
		}
		return l.GetResourceVersion(), nil
	}
}

func (c *writeCounter) count(ctx context.Context, events watch.Interface, n *int) {
	defer events.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-events.ResultChan():
			if !ok {
				return
			}
			if e.Type == watch.Added || e.Type == watch.Modified || e.Type == watch.Deleted {
				c.mu.Lock()
				*n++
				c.mu.Unlock()
			}
		}
	}
}

// Writes are the writes seen so far.
func (c *writeCounter) Writes() writes {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// Stop ends the watches and returns the writes they saw.
func (c *writeCounter) Stop() writes {
	c.cancel()
	c.wg.Wait()
	return c.Writes()
}
