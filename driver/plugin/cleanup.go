package plugin

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	cgoresource "k8s.io/client-go/kubernetes/typed/resource/v1"
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

// DeleteSlices deletes every node's ResourceSlices of the driver: the chart's pre-delete hook. A
// plugin never deletes its own (see app.Run).
func DeleteSlices(ctx context.Context, client SliceClient, driverName string) (int, error) {
	selector := fields.Set{"spec.driver": driverName}.AsSelector().String()
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
