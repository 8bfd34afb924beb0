package app

import (
	"context"
	"fmt"
	"io"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	resourcev1alpha3 "k8s.io/api/resource/v1alpha3"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/pager"
	draclient "k8s.io/dynamic-resource-allocation/client"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// readClient talks to the cluster of the kubeconfig flags as the user, each request bounded by
// --request-timeout. Lists of a thousand ResourceSlices decode several times faster from protobuf,
// which every built-in type speaks.
type readClient struct {
	cs   kubernetes.Interface
	dra  *draclient.Client
	meta metadata.Interface
}

func newReadClient(flags *genericclioptions.ConfigFlags) (*readClient, error) {
	cfg, err := restConfig(flags)
	if err != nil {
		return nil, err
	}
	return newReadClientForConfig(cfg)
}

func newReadClientForConfig(cfg *rest.Config) (*readClient, error) {
	cfg = rest.CopyConfig(cfg)
	// client-go's default rate limit, 5 requests a second after a burst of 10 for each API group,
	// held a list of a large cluster back by more than a second: why sends 17 requests to
	// resource.k8s.io at 40,000 claims and 5,000 slices, at once. The pages bound the requests,
	// and the API server's priority and fairness shares its capacity among clients.
	cfg.QPS = -1
	// The metadata client asks for its own content type; copy before setting protobuf.
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &readClient{cs: cs, dra: draclient.New(cs), meta: meta}, nil
}

// listOptions says what to list besides ResourceSlices and DeviceTaintRules.
type listOptions struct {
	// claims lists the ResourceClaims of all namespaces, as the fleet reads them.
	claims  bool
	classes bool
	// nodes lists the Nodes (name and labels only); nodeSelector and nodeName narrow the list.
	nodes        bool
	nodeSelector string
	nodeName     string
}

// list reads the cluster state, every kind at once, each in pages (listInPages), telling errOut
// what it waits for when that takes more than progressDelay. notes say what could not be read
// and is left out (DeviceTaintRules the user may not list).
func (c *readClient) list(ctx context.Context, opts listOptions, errOut io.Writer) (state *clusterState, notes []string, err error) {
	p := newProgress(errOut, progressDelay)
	defer p.stop()
	state = &clusterState{}
	g, ctx := errgroup.WithContext(ctx)
	run := func(what string, f func() (int, error)) {
		p.begin(what)
		g.Go(func() error {
			n, err := f()
			if err == nil {
				p.done(what, n)
			}
			return err
		})
	}
	run("ResourceSlices", func() (int, error) {
		n, err := listKept(ctx, p, "ResourceSlices", metav1.ListOptions{Limit: slicesPageSize}, c.dra.ResourceSlices().List, &state.Slices, keptSlice)
		return n, wrapList("ResourceSlices", err)
	})
	if opts.claims {
		run("ResourceClaims", func() (int, error) {
			n, err := c.listClaims(ctx, p, &state.Kept)
			return n, wrapList("ResourceClaims in all namespaces", err)
		})
	}
	var ruleNote string
	run("DeviceTaintRules", func() (n int, err error) {
		state.TaintRules, ruleNote, err = c.listTaintRules(ctx, p)
		return len(state.TaintRules), err
	})
	if opts.classes {
		run("DeviceClasses", func() (int, error) {
			n, err := listKept(ctx, p, "DeviceClasses", metav1.ListOptions{}, c.dra.DeviceClasses().List, &state.Classes,
				func(c *resourceapi.DeviceClass) *resourceapi.DeviceClass { return c })
			return n, wrapList("DeviceClasses", err)
		})
	}
	if opts.nodes {
		run("Nodes", func() (int, error) {
			n, err := c.listNodes(ctx, p, opts.nodeSelector, opts.nodeName, &state.Nodes)
			return n, wrapList("Nodes", err)
		})
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	if ruleNote != "" {
		notes = append(notes, ruleNote)
	}
	return state, notes, nil
}

func wrapList(what string, err error) error {
	if err != nil {
		return fmt.Errorf("list %s: %w", what, err)
	}
	return nil
}

// listNodes reads the nodes' names and labels only (keptNode) into out: a thousand full Nodes
// are megabytes of status.
func (c *readClient) listNodes(ctx context.Context, p *progress, labelSelector, name string, out *[]*corev1.Node) (int, error) {
	opts := metav1.ListOptions{LabelSelector: labelSelector, Limit: nodesPageSize}
	if name != "" {
		opts.FieldSelector = "metadata.name=" + name
	}
	return listKept(ctx, p, "Nodes", opts, c.meta.Resource(corev1.SchemeGroupVersion.WithResource("nodes")).List, out, keptNode)
}

// listKept lists in pages (listInPages) into out what keep keeps of each object.
func listKept[L runtime.Object, O runtime.Object, T any](ctx context.Context, p *progress, what string, opts metav1.ListOptions,
	list func(context.Context, metav1.ListOptions) (L, error), out *[]T, keep func(O) T) (int, error) {
	return listInPages(ctx, p, what, opts,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return list(ctx, o) },
		func() { *out = nil },
		func(obj runtime.Object) error {
			*out = append(*out, keep(obj.(O)))
			return nil
		})
}

// listTaintRules reads the DeviceTaintRules in the newest version served: v1 (1.37), v1beta2
// (1.36, converted by k8s.io/dynamic-resource-allocation) or v1alpha3 (1.33–1.35 with the
// DRADeviceTaints gate). None served is no error; not being allowed to list them is a note.
func (c *readClient) listTaintRules(ctx context.Context, p *progress) ([]*resourceapi.DeviceTaintRule, string, error) {
	var out []*resourceapi.DeviceTaintRule
	versions := []struct {
		list    pager.ListPageFunc
		convert func(runtime.Object) (*resourceapi.DeviceTaintRule, error)
	}{
		{func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.cs.ResourceV1().DeviceTaintRules().List(ctx, o)
		}, func(obj runtime.Object) (*resourceapi.DeviceTaintRule, error) {
			return obj.(*resourceapi.DeviceTaintRule), nil
		}},
		{func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.cs.ResourceV1beta2().DeviceTaintRules().List(ctx, o)
		}, func(obj runtime.Object) (*resourceapi.DeviceTaintRule, error) {
			beta := obj.(*resourcev1beta2.DeviceTaintRule)
			r := &resourceapi.DeviceTaintRule{}
			if err := resourceversion.Scheme().Convert(beta, r, nil); err != nil {
				return nil, fmt.Errorf("convert DeviceTaintRule %s to v1: %w", beta.Name, err)
			}
			return r, nil
		}},
		{func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.cs.ResourceV1alpha3().DeviceTaintRules().List(ctx, o)
		}, func(obj runtime.Object) (*resourceapi.DeviceTaintRule, error) {
			return taintRuleFromV1alpha3(obj.(*resourcev1alpha3.DeviceTaintRule)), nil
		}},
	}
	for _, v := range versions {
		_, err := listInPages(ctx, p, "DeviceTaintRules", metav1.ListOptions{}, v.list, func() { out = nil },
			func(obj runtime.Object) error {
				r, err := v.convert(obj)
				out = append(out, r)
				return err
			})
		switch {
		case err == nil:
			return out, "", nil
		case !apierrors.IsNotFound(err):
			return nil, taintRuleNote(err), nilIfForbidden(err)
		}
	}
	return nil, "", nil
}

func taintRuleNote(err error) string {
	if apierrors.IsForbidden(err) {
		return "taints from DeviceTaintRules are not shown: you may not list them (" + err.Error() + ")"
	}
	return ""
}

func nilIfForbidden(err error) error {
	if apierrors.IsForbidden(err) {
		return nil
	}
	return fmt.Errorf("list DeviceTaintRules: %w", err)
}
