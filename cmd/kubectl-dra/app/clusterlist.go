package app

import (
	"context"
	"fmt"
	"io"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	draclient "k8s.io/dynamic-resource-allocation/client"

	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// readClient talks to the cluster of the kubeconfig flags as the user, each request bounded by
// clusterTimeout. Lists of a thousand ResourceSlices decode several times faster from protobuf,
// which every built-in type speaks.
type readClient struct {
	cs   kubernetes.Interface
	dra  *draclient.Client
	meta metadata.Interface
}

func newReadClient(flags *genericclioptions.ConfigFlags) (*readClient, error) {
	cfg, err := flags.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = clusterTimeout
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

// listOptions says what to list besides ResourceSlices, ResourceClaims and DeviceTaintRules.
type listOptions struct {
	classes bool
	// nodes lists the Nodes (name and labels only); nodeSelector and nodeName narrow the list.
	nodes        bool
	nodeSelector string
	nodeName     string
}

// list reads the cluster state with one list call per kind, all at once, telling errOut what it
// waits for when that takes more than progressDelay. notes say what could not be read and is left
// out (DeviceTaintRules the user may not list).
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
	run("ResourceSlices", func() (n int, err error) {
		state.Slices, err = inventory.ListSlices(ctx, c.dra)
		return len(state.Slices), err
	})
	run("ResourceClaims", func() (int, error) {
		claims, err := c.dra.ResourceClaims("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0, fmt.Errorf("list ResourceClaims in all namespaces: %w", err)
		}
		for i := range claims.Items {
			state.Claims = append(state.Claims, &claims.Items[i])
		}
		return len(state.Claims), nil
	})
	var ruleNote string
	run("DeviceTaintRules", func() (n int, err error) {
		state.TaintRules, ruleNote, err = c.listTaintRules(ctx)
		return len(state.TaintRules), err
	})
	if opts.classes {
		run("DeviceClasses", func() (n int, err error) {
			state.Classes, err = inventory.ListClasses(ctx, c.dra)
			return len(state.Classes), err
		})
	}
	if opts.nodes {
		run("Nodes", func() (n int, err error) {
			state.Nodes, err = c.listNodes(ctx, opts.nodeSelector, opts.nodeName)
			return len(state.Nodes), err
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

// listNodes reads the nodes' names and labels only: that is all the allocator and a node selector
// look at, and a thousand full Nodes are megabytes of status.
func (c *readClient) listNodes(ctx context.Context, labelSelector, name string) ([]*corev1.Node, error) {
	opts := metav1.ListOptions{LabelSelector: labelSelector}
	if name != "" {
		opts.FieldSelector = "metadata.name=" + name
	}
	list, err := c.meta.Resource(corev1.SchemeGroupVersion.WithResource("nodes")).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("list Nodes: %w", err)
	}
	out := make([]*corev1.Node, 0, len(list.Items))
	for _, m := range list.Items {
		out = append(out, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: m.Name, Labels: m.Labels, UID: m.UID}})
	}
	return out, nil
}

// listTaintRules reads the DeviceTaintRules in the newest version served: v1 (1.37), v1beta2
// (1.36, converted by k8s.io/dynamic-resource-allocation) or v1alpha3 (1.33–1.35 with the
// DRADeviceTaints gate). None served is no error; not being allowed to list them is a note.
func (c *readClient) listTaintRules(ctx context.Context) ([]*resourceapi.DeviceTaintRule, string, error) {
	var out []*resourceapi.DeviceTaintRule
	v1list, err := c.cs.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{})
	if err == nil {
		for i := range v1list.Items {
			out = append(out, &v1list.Items[i])
		}
		return out, "", nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, taintRuleNote(err), nilIfForbidden(err)
	}
	beta, err := c.cs.ResourceV1beta2().DeviceTaintRules().List(ctx, metav1.ListOptions{})
	if err == nil {
		for i := range beta.Items {
			r := &resourceapi.DeviceTaintRule{}
			if err := resourceversion.Scheme().Convert(&beta.Items[i], r, nil); err != nil {
				return nil, "", fmt.Errorf("convert DeviceTaintRule %s to v1: %w", beta.Items[i].Name, err)
			}
			out = append(out, r)
		}
		return out, "", nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, taintRuleNote(err), nilIfForbidden(err)
	}
	alpha, err := c.cs.ResourceV1alpha3().DeviceTaintRules().List(ctx, metav1.ListOptions{})
	switch {
	case err == nil:
		for i := range alpha.Items {
			out = append(out, taintRuleFromV1alpha3(&alpha.Items[i]))
		}
		return out, "", nil
	case apierrors.IsNotFound(err):
		return nil, "", nil
	}
	return nil, taintRuleNote(err), nilIfForbidden(err)
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
