package plugin

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	cgoresource "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/liveness"
)

// SliceClient reads and deletes ResourceSlices in whatever version the server serves
// (k8s.io/dynamic-resource-allocation/client implements it).
type SliceClient interface {
	ResourceSlices() cgoresource.ResourceSliceInterface
}

// DRASocketName is the helper's DRA socket in the plugin data directory: "dra.sock", or
// "dra-<pod UID>.sock" with RollingUpdate (see kubeletplugin.Start).
func DRASocketName(podUID string) string {
	if podUID == "" {
		return "dra.sock"
	}
	return "dra-" + podUID + ".sock"
}

// SuccessorRunning tells whether another plugin instance is serving this driver on this node.
//
// The rule: with RollingUpdate every instance creates "dra-<its pod UID>.sock" in the shared plugin
// data directory, which the helper reserves for one driver. The kubelet itself treats an instance as
// available when it can reach that socket. So a successor is taking over exactly when a DRA socket
// other than ours exists there and answers a NodePrepareResources call with no claims. A socket left
// behind by a killed instance refuses the connection and does not count. Without RollingUpdate
// (no pod UID) there is only one socket name and never a successor.
func SuccessorRunning(ctx context.Context, dataDir, ownSocket string) (string, bool) {
	matches, _ := filepath.Glob(filepath.Join(dataDir, "dra*.sock"))
	for _, m := range matches {
		if filepath.Base(m) == ownSocket {
			continue
		}
		probeCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := liveness.ProbeDRA(probeCtx, m)
		cancel()
		if err == nil {
			return m, true
		}
		klog.FromContext(ctx).V(2).Info("Other DRA socket does not answer; not a successor", "socket", m, "err", err)
	}
	return "", false
}

// DeleteSlices deletes this node's ResourceSlices of the driver, or every node's when nodeName is
// empty (the chart's pre-delete hook). The helper's Stop leaves them in place (a restarting plugin
// would republish the same), but a plugin that goes away for good must not leave devices the
// scheduler would allocate and no kubelet could prepare.
func DeleteSlices(ctx context.Context, client SliceClient, driverName, nodeName string) (int, error) {
	set := fields.Set{"spec.driver": driverName}
	if nodeName != "" {
		set["spec.nodeName"] = nodeName
	}
	selector := set.AsSelector().String()
	list, err := client.ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: selector})
	if err != nil {
		return 0, fmt.Errorf("list ResourceSlices with %s: %w", selector, err)
	}
	deleted := 0
	for _, s := range list.Items {
		err := client.ResourceSlices().Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return deleted, fmt.Errorf("delete ResourceSlice %s: %w", s.Name, err)
		}
		deleted++
	}
	return deleted, nil
}
