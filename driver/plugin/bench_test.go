package plugin

import (
	"fmt"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// BenchmarkDriverPrepareUnprepare is the plugin's own share of a prepare+unprepare (CDI spec write,
// two checkpoint saves with fsync), without the API server read and gRPC that the end-to-end
// benchmark in cmd/gpu-kubelet-plugin includes. 99 other claims stay prepared, so the checkpoint
// has its realistic size.
func BenchmarkDriverPrepareUnprepare(b *testing.B) {
	ctx := klog.NewContext(b.Context(), klog.Background().V(10))
	hb := newHarness(b)
	for i := 1; i < 100; i++ {
		c := claim(fmt.Sprintf("uid-%d", i), fmt.Sprintf("c%d", i), []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0")})
		c.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
		if _, err := hb.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c}); err != nil {
			b.Fatal(err)
		}
	}
	c := claim("uid-0", "c0", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-1")})
	var d []time.Duration
	b.StartTimer()
	for b.Loop() {
		start := time.Now()
		res, err := hb.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
		if err != nil || res[c.UID].Err != nil {
			b.Fatal(err, res[c.UID].Err)
		}
		if _, err := hb.driver.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: types.UID("uid-0")}}); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(start))
	}
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, "pair-p50-ms")
	b.ReportMetric(float64(d[len(d)*99/100].Microseconds())/1000, "pair-p99-ms")
}
