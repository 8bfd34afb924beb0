package scale

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// maxNodeWrites bounds MemoryOptions.NodeWrites: a kubelet reports its status at least every 5
// minutes, 17 writes a second at 5,000 nodes; the node lifecycle controller adds its own.
const maxNodeWrites = 200

// nodeWriter writes the Ready condition of the fleet's nodes, one node after another, at a rate:
// the writes a fleet's kubelets and node controller make, which a webhook keeping the fleet takes
// in and the upstream webhook, keeping nothing, does not.
type nodeWriter struct {
	// stopped ends the writes between two of them, never during one: a write cancelled in flight
	// may have reached the API server while the writer counts it as failed.
	stopped chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	mu      sync.Mutex
	n       int
	err     error
}

// writeNodes patches the status of the nodes named NodeName(0..nodes-1) rate times a second until
// stop. A rate of 0 writes nothing.
func writeNodes(ctx context.Context, cs kubernetes.Interface, nodes, rate int) *nodeWriter {
	w := &nodeWriter{stopped: make(chan struct{})}
	if rate <= 0 || nodes <= 0 {
		return w
	}
	w.wg.Go(func() {
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		written := 0
		for i := 0; ; i = (i + 1) % nodes {
			select {
			case <-w.stopped:
				return
			case <-ctx.Done():
				return
			case now := <-tick.C:
				// The count in the message makes every patch a write: a heartbeat's time has
				// whole seconds, and a patch that changes nothing writes nothing.
				written++
				patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":"Unknown","reason":"NodeStatusUnknown","message":"scale harness write %d","lastHeartbeatTime":%q}]}}`,
					written, now.UTC().Format(time.RFC3339))
				_, err := cs.CoreV1().Nodes().PatchStatus(ctx, NodeName(i), []byte(patch))
				w.mu.Lock()
				if err == nil {
					w.n++
				} else if ctx.Err() == nil && w.err == nil {
					w.err = fmt.Errorf("node writes: %s: %w", NodeName(i), err)
					klog.FromContext(ctx).Error(err, "Node write failed", "node", NodeName(i))
				}
				w.mu.Unlock()
			}
		}
	})
	return w
}

// stop ends the writes and returns how many were made, and the first that failed.
func (w *nodeWriter) stop() (int, error) {
	w.once.Do(func() { close(w.stopped) })
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n, w.err
}
