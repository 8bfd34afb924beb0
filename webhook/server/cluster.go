package server

import (
	"context"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/servedfeatures"
	"github.com/gpu-dra/gpu-dra/webhook/claimadmission"
	"github.com/gpu-dra/gpu-dra/webhook/podinject"
)

// cluster answers the handlers' questions about the cluster from the inventory informers and the
// feature probes.
type cluster struct {
	informers *inventory.Informers
	// classes are the stored DeviceClasses, as restored (classRestorer.list).
	classes  func() []*resourceapi.DeviceClass
	features *servedfeatures.Detector
	cs       kubernetes.Interface
	shared   sharedDevices
}

// sharedDevices tells whether the driver publishes GPUs several claims may share
// (claimvalidation.Validator, from its view of the published slices).
type sharedDevices interface {
	PublishesShared() (bool, error)
}

var (
	_ podinject.Cluster                 = &cluster{}
	_ claimadmission.AdminAccessSupport = &cluster{}
	_ claimadmission.NamespaceLabels    = &cluster{}
)

// extendedResourceKubelet is the first release whose kubelet, with its defaults, prepares the
// claim the scheduler makes for a pod's extended resources (DRAExtendedResource, beta in 1.36).
// During an upgrade the control plane goes first: an older kubelet admits such a pod without the
// resource it does not advertise, and runs it without GPUs.
var extendedResourceKubelet = version.MajorMinor(1, 36)

// ServesExtendedResource: the API server keeps DeviceClass extendedResourceName (read back from
// the stored classes), and for an explicit name the stored class has it (a class just upgraded by
// helm may not yet), and no node runs a kubelet too old to prepare the claim the scheduler makes.
// The scheduler's gate cannot be seen from the API; it is assumed to match the API server's, as it
// does with every release's defaults.
func (c *cluster) ServesExtendedResource(ctx context.Context, name corev1.ResourceName, class string) bool {
	if !c.informers.HasSynced() {
		return false
	}
	classes := c.classes()
	if !c.features.ExtendedResources(ctx, classes) {
		return false
	}
	if node := c.informers.KubeletBefore(extendedResourceKubelet); node != "" {
		klog.FromContext(ctx).V(2).Info("A kubelet older than the release that serves DRA extended resources runs; turning limits into a claim", "node", node, "release", extendedResourceKubelet)
		return false
	}
	if strings.HasPrefix(string(name), resourceapi.ResourceDeviceClassPrefix) {
		return true
	}
	for _, dc := range classes {
		if dc.Name == class {
			return ptr.Deref(dc.Spec.ExtendedResourceName, "") == string(name)
		}
	}
	return false
}

func (c *cluster) DevicePluginNode(name corev1.ResourceName) string {
	return c.informers.NodeAdvertising(name)
}

func (c *cluster) ServesPrioritizedList(ctx context.Context) (bool, error) {
	return c.features.PrioritizedList(ctx)
}

func (c *cluster) AdminAccess(ctx context.Context) (servedfeatures.AdminAccessSupport, error) {
	return c.features.AdminAccess(ctx)
}

func (c *cluster) NamespaceLabels(ctx context.Context, namespace string) (map[string]string, error) {
	ns, err := c.cs.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return ns.Labels, nil
}

// SharesMemory: the API server keeps capacity requests and the driver publishes shared-memory
// GPUs, so a pod's memory annotation can ask for a share of one.
func (c *cluster) SharesMemory(ctx context.Context) (bool, error) {
	served, err := c.features.ConsumableCapacity(ctx)
	if err != nil || !served {
		return false, err
	}
	return c.shared.PublishesShared()
}
