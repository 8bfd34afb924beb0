package podinject

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	sigsjson "sigs.k8s.io/json"

	"github.com/gpu-dra/gpu-dra/internal/podgroups"
)

const (
	// podGroupTimeout bounds one read of a PodGroup, well inside the webhook's timeout.
	podGroupTimeout = 3 * time.Second
	// podGroupTTL is how long a read PodGroup is trusted. Its resourceClaims are immutable, but a
	// group may be deleted and created again with others; a burst of a group's pods (a Deployment
	// scaled up) costs one read.
	podGroupTTL = 5 * time.Second
	// servedTTL is how long the answer of discovery is trusted: the API server serves PodGroups
	// or not until it restarts with other flags.
	servedTTL = time.Minute
)

// PodGroupClient reads PodGroups by name through the API server, one object per review at most
// (never a list): the version served is found by discovery, and only spec.resourceClaims is
// decoded. RBAC: scheduling.k8s.io podgroups get.
type PodGroupClient struct {
	discovery discovery.DiscoveryInterface
	rest      rest.Interface

	groups   *cache.LRUExpireCache
	inflight singleflight.Group

	mu         sync.Mutex
	version    string // "" when PodGroups are not served
	checked    time.Time
	reported   bool // the last discovery's answer was logged
	lastServed bool
}

var _ PodGroups = &PodGroupClient{}

// NewPodGroupClient reads PodGroups through d (a clientset's Discovery()).
func NewPodGroupClient(d discovery.DiscoveryInterface) *PodGroupClient {
	return &PodGroupClient{discovery: d, rest: d.RESTClient(), groups: cache.NewLRUExpireCache(maxCacheEntries)}
}

// podGroupView is the part of a PodGroup the handler reads.
type podGroupView struct {
	Spec struct {
		ResourceClaims []corev1.PodResourceClaim `json:"resourceClaims"`
	} `json:"spec"`
}

// SharedClaims reads PodGroup namespace/name in the newest served version.
func (c *PodGroupClient) SharedClaims(ctx context.Context, namespace, name string) (GroupClaims, error) {
	version, err := c.servedVersion(ctx)
	if err != nil || version == "" {
		return GroupClaims{}, err
	}
	key := namespace + "/" + name
	if g, ok := c.groups.Get(key); ok {
		return g.(GroupClaims), nil
	}
	ch := c.inflight.DoChan(key, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), podGroupTimeout)
		defer cancel()
		return c.get(ctx, version, namespace, name)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return GroupClaims{}, r.Err
		}
		g := r.Val.(GroupClaims)
		if g.Found {
			c.groups.Add(key, g, podGroupTTL)
		}
		return g, nil
	case <-ctx.Done():
		return GroupClaims{}, fmt.Errorf("gave up reading PodGroup %s: %w", key, context.Cause(ctx))
	}
}

func (c *PodGroupClient) get(ctx context.Context, version, namespace, name string) (GroupClaims, error) {
	path := fmt.Sprintf("/apis/%s/%s/namespaces/%s/podgroups/%s", podgroups.Group, version, namespace, name)
	raw, err := c.rest.Get().AbsPath(path).Do(ctx).Raw()
	switch {
	case apierrors.IsNotFound(err):
		return GroupClaims{Served: true}, nil
	case err != nil:
		return GroupClaims{}, fmt.Errorf("get PodGroup %s/%s (%s/%s): %w", namespace, name, podgroups.Group, version, err)
	}
	var view podGroupView
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, &view); err != nil {
		return GroupClaims{}, fmt.Errorf("decode PodGroup %s/%s: %w", namespace, name, err)
	}
	var claims []corev1.PodResourceClaim
	for _, rc := range view.Spec.ResourceClaims {
		// The API server allows exactly one of the two; anything else is not an entry a pod can match.
		if (rc.ResourceClaimName == nil) != (rc.ResourceClaimTemplateName == nil) {
			claims = append(claims, rc)
		}
	}
	return GroupClaims{Served: true, Found: true, Claims: claims}, nil
}

// servedVersion is the newest version of scheduling.k8s.io serving podgroups, "" for none, as
// discovery said at most servedTTL ago; concurrent reviews share one discovery, and each waits as
// long as its context allows.
func (c *PodGroupClient) servedVersion(ctx context.Context) (string, error) {
	c.mu.Lock()
	if !c.checked.IsZero() && time.Since(c.checked) < servedTTL {
		defer c.mu.Unlock()
		return c.version, nil
	}
	c.mu.Unlock()
	ch := c.inflight.DoChan("\x00discovery", func() (any, error) { return c.discover(klog.FromContext(ctx)) })
	select {
	case r := <-ch:
		if r.Err != nil {
			return "", r.Err
		}
		return r.Val.(string), nil
	case <-ctx.Done():
		return "", fmt.Errorf("gave up discovering whether PodGroups are served: %w", context.Cause(ctx))
	}
}

// discover asks discovery which version serves podgroups. The answer is logged once, and again
// when it changes.
func (c *PodGroupClient) discover(logger klog.Logger) (string, error) {
	version, err := podgroups.ServedVersion(c.discovery)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.version, c.checked = version, time.Now()
	served := version != ""
	if !c.reported || served != c.lastServed {
		if served {
			logger.Info("PodGroups are served: pods of a group whose claim is named "+ClaimName+" share the group's GPUs", "version", podgroups.Group+"/"+version)
		} else {
			logger.Info("PodGroups are not served: pods of a group get GPUs of their own", "needs", podgroups.Needs)
		}
		c.reported, c.lastServed = true, served
	}
	return version, nil
}
