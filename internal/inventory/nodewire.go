package inventory

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	serjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	sjson "sigs.k8s.io/json"

	"github.com/gpu-dra/gpu-dra/internal/listing"
)

// nodeWire is what Node keeps of a Node, decoded straight from the API server's JSON. Every write
// to every Node reaches the informer: each kubelet's status report, the controllers' taints and
// conditions, tens a second in a large fleet. Decoded whole, a Node is its status (conditions,
// images, addresses) and managedFields too, garbage several times the size of what is kept, on
// every one of them; the decoder skips what no field here names without allocating it.
type nodeWire struct {
	Metadata struct {
		Name            string            `json:"name"`
		ResourceVersion string            `json:"resourceVersion"`
		Labels          map[string]string `json:"labels"`
	} `json:"metadata"`
	Status struct {
		Allocatable v1.ResourceList `json:"allocatable"`
		NodeInfo    struct {
			KubeletVersion string `json:"kubeletVersion"`
		} `json:"nodeInfo"`
	} `json:"status"`
}

// nodeWireList is one page of a list of Nodes.
type nodeWireList struct {
	Metadata metav1.ListMeta `json:"metadata"`
	Items    []nodeWire      `json:"items"`
}

// GetContinue makes a page a listing.Page.
func (l *nodeWireList) GetContinue() string { return l.Metadata.Continue }

// NodeList is a list of Nodes, as the node informer's list returns them.
type NodeList = CompactList[Node, *Node]

// keepOnly is the allocatable filter of NewInformers' keepAllocatable.
func keepOnly(names []v1.ResourceName) func(v1.ResourceName) bool {
	return func(name v1.ResourceName) bool { return slices.Contains(names, name) }
}

// fromWire keeps of w what Node holds, of its allocatable resources those keep accepts.
func (in *Interner) fromWire(w *nodeWire, keep func(v1.ResourceName) bool) *Node {
	return in.node(&v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: w.Metadata.Name, ResourceVersion: w.Metadata.ResourceVersion, Labels: w.Metadata.Labels},
		Status:     v1.NodeStatus{Allocatable: w.Status.Allocatable, NodeInfo: v1.NodeSystemInfo{KubeletVersion: w.Status.NodeInfo.KubeletVersion}},
	}, keep)
}

// nodeListWatch lists Nodes in pages and watches them through the clientset's REST client, every
// node decoded as nodeWire and kept as a Node. A clientset with no REST client (client-go's fake)
// is read through its typed client, each Node kept as a Node once decoded whole.
func (in *Interner) nodeListWatch(cs kubernetes.Interface, keep func(v1.ResourceName) bool) cache.ListerWatcher {
	rc := cs.CoreV1().RESTClient()
	if c, ok := rc.(*rest.RESTClient); ok && c == nil {
		return in.typedNodeListWatch(cs.CoreV1().Nodes(), keep)
	}
	return listing.Plain(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return in.listNodes(ctx, rc, o, keep)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return in.watchNodes(ctx, rc, o, keep)
		},
	})
}

func (in *Interner) typedNodeListWatch(nodes corev1client.NodeInterface, keep func(v1.ResourceName) bool) cache.ListerWatcher {
	return listing.Plain(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			out := &NodeList{}
			err := listing.InPages(ctx, o, listPageSize, nodes.List, func(page *v1.NodeList) {
				for i := range page.Items {
					out.Items = append(out.Items, in.node(&page.Items[i], keep))
				}
				out.ResourceVersion = page.ResourceVersion
			})
			return out, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := nodes.Watch(ctx, o)
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
				if n, ok := e.Object.(*v1.Node); ok {
					e.Object = in.node(n, keep)
				}
				return e, true
			}), nil
		},
	})
}

// nodesRequest asks for Nodes in JSON, the only encoding nodeWire decodes.
func nodesRequest(rc rest.Interface, o *metav1.ListOptions) *rest.Request {
	return rc.Get().Resource("nodes").VersionedParams(o, scheme.ParameterCodec).SetHeader("Accept", "application/json")
}

func (in *Interner) listNodes(ctx context.Context, rc rest.Interface, o metav1.ListOptions, keep func(v1.ResourceName) bool) (*NodeList, error) {
	out := &NodeList{}
	err := listing.InPages(ctx, o, listPageSize, func(ctx context.Context, o metav1.ListOptions) (*nodeWireList, error) {
		raw, err := nodesRequest(rc, &o).Do(ctx).Raw()
		if err != nil {
			return nil, fmt.Errorf("list Nodes: %w", err)
		}
		page := &nodeWireList{}
		if err := sjson.UnmarshalCaseSensitivePreserveInts(raw, page); err != nil {
			return nil, fmt.Errorf("list Nodes: decode a page: %w", err)
		}
		return page, nil
	}, func(page *nodeWireList) {
		for i := range page.Items {
			out.Items = append(out.Items, in.fromWire(&page.Items[i], keep))
		}
		out.ResourceVersion = page.Metadata.ResourceVersion
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (in *Interner) watchNodes(ctx context.Context, rc rest.Interface, o metav1.ListOptions, keep func(v1.ResourceName) bool) (watch.Interface, error) {
	o.Watch = true
	body, err := nodesRequest(rc, &o).Stream(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch Nodes: %w", err)
	}
	d := newNodeEvents(body, func(w *nodeWire) *Node { return in.fromWire(w, keep) })
	return watch.NewStreamWatcher(d, apierrors.NewClientErrorReporter(http.StatusInternalServerError, "GET", "ClientWatchDecoding")), nil
}

// newNodeEvents decodes the watch events of body, a watch's response in JSON, keeping each node
// as toNode returns it.
func newNodeEvents(body io.ReadCloser, toNode func(*nodeWire) *Node) *nodeEvents {
	d := &nodeEvents{toNode: toNode}
	d.frames = streaming.NewDecoder(serjson.Framer.NewFrameReader(body), &d.frame)
	return d
}

// nodeEvents decodes a watch of Nodes, one frame (bounded by the streaming decoder) at a time.
type nodeEvents struct {
	frames streaming.Decoder
	frame  nodeFrame
	toNode func(*nodeWire) *Node
}

// Decode returns the next event: a Node, or for an ERROR event the Status the API server sent,
// which the reflector turns into the error it handles (a resourceVersion too old: list again).
func (d *nodeEvents) Decode() (watch.EventType, runtime.Object, error) {
	if _, _, err := d.frames.Decode(nil, nil); err != nil {
		return "", nil, err
	}
	e := &d.frame.event
	switch e.Type {
	case watch.Added, watch.Modified, watch.Deleted, watch.Bookmark:
		return e.Type, d.toNode(&e.Object), nil
	case watch.Error:
		return e.Type, d.frame.status, nil
	}
	return "", nil, fmt.Errorf("watch Nodes: event type %q is none a watch sends", e.Type)
}

// Close closes the watch's response.
func (d *nodeEvents) Close() { _ = d.frames.Close() }

// nodeFrame decodes one frame of a watch of Nodes into event (an ERROR's Status into status). It
// is the runtime.Decoder the streaming decoder hands each frame to, in the buffer it reuses.
type nodeFrame struct {
	event struct {
		Type   watch.EventType `json:"type"`
		Object nodeWire        `json:"object"`
	}
	status *metav1.Status
}

func (f *nodeFrame) Decode(data []byte, _ *schema.GroupVersionKind, _ runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	f.event.Type, f.event.Object, f.status = "", nodeWire{}, nil
	err := sjson.UnmarshalCaseSensitivePreserveInts(data, &f.event)
	if f.event.Type == watch.Error {
		// The object is a Status, whose "status" is a string: nodeWire cannot hold it.
		var e struct {
			Object metav1.Status `json:"object"`
		}
		if err := sjson.UnmarshalCaseSensitivePreserveInts(data, &e); err != nil {
			return nil, nil, fmt.Errorf("watch Nodes: decode an ERROR event: %w", err)
		}
		f.status = &e.Object
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("watch Nodes: decode an event: %w", err)
	}
	return nil, nil, nil
}
