package plugin

import (
	"fmt"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/driver/devicestatus"
)

// BenchmarkDriverPrepareUnprepare is the plugin's own share of a prepare+unprepare (CDI spec write,
// two checkpoint saves with fsync), without the API server read and gRPC that the end-to-end
// benchmark in cmd/gpu-kubelet-plugin includes. 99 other claims stay prepared, so the checkpoint
// has its realistic size.
func BenchmarkDriverPrepareUnprepare(b *testing.B) {
	hb := newHarness(b)
	others := func(i int) []resourceapi.DeviceRequestAllocationResult {
		r := result("gpu", "gpu-0")
		r.AdminAccess = ptr.To(true)
		return []resourceapi.DeviceRequestAllocationResult{r}
	}
	benchPrepareUnprepare(b, hb, others, []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-1")})
}

// BenchmarkDriverPrepareUnprepareShares is the same for shares of shared-memory GPUs (KEP-5075):
// the 99 other claims hold shares of gpu-0, which the guard sums on every prepare, and the
// measured claim prepares a share of gpu-1. Run with the one above (-bench
// BenchmarkDriverPrepareUnprepare) to compare.
func BenchmarkDriverPrepareUnprepareShares(b *testing.B) {
	hb := newSharedHarness(b)
	others := func(i int) []resourceapi.DeviceRequestAllocationResult {
		return []resourceapi.DeviceRequestAllocationResult{shareResult("gpu", "gpu-0", fmt.Sprintf("share-%d", i), "800Mi", "1")}
	}
	benchPrepareUnprepare(b, hb, others, []resourceapi.DeviceRequestAllocationResult{shareResult("gpu", "gpu-1", "share-0", "16Gi", "20")})
}

// benchPrepareUnprepare prepares 99 claims of others, then measures prepare+unprepare pairs of
// one claim of measured.
func benchPrepareUnprepare(b *testing.B, hb *harness, others func(i int) []resourceapi.DeviceRequestAllocationResult, measured []resourceapi.DeviceRequestAllocationResult) {
	ctx := klog.NewContext(b.Context(), klog.Background().V(10))
	for i := 1; i < 100; i++ {
		c := claim(fmt.Sprintf("uid-%d", i), fmt.Sprintf("c%d", i), others(i))
		res, err := hb.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
		if err != nil || res[c.UID].Err != nil {
			b.Fatal(err, res[c.UID].Err)
		}
	}
	c := claim("uid-0", "c0", measured)
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

// BenchmarkDriverPrepareUnprepareWithStatus is the same with the claim status writer on, its
// applies going to client-go's fake clientset: what recording the status adds to the prepare path
// (queueing) and what its background writes take from the same CPUs. Each prepare is of a new
// claim, unprepared 7 prepares later (the node has 8 GPUs), so that each one's status is really written (an unprepare
// right after the prepare would mostly drop the write).
func BenchmarkDriverPrepareUnprepareWithStatus(b *testing.B) {
	ctx := klog.NewContext(b.Context(), klog.Background().V(10))
	hb := newHarness(b)
	cs := fake.NewClientset()
	w, err := devicestatus.New(cs, testDriver, "v1")
	if err != nil {
		b.Fatal(err)
	}
	defer w.Start(ctx)()
	WithStatusRecorder(w)(hb.driver)
	const lag = 7
	var d []time.Duration
	var uids []types.UID
	for i := 0; b.Loop(); i++ {
		c := claim(fmt.Sprintf("uid-%d", i), fmt.Sprintf("c%d", i), []resourceapi.DeviceRequestAllocationResult{result("gpu", fmt.Sprintf("gpu-%d", i%(lag+1)))})
		if err := cs.Tracker().Add(c.DeepCopy()); err != nil {
			b.Fatal(err)
		}
		uids = append(uids, c.UID)
		start := time.Now()
		res, err := hb.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
		if err != nil || res[c.UID].Err != nil {
			b.Fatal(err, res[c.UID].Err)
		}
		if i >= lag {
			if _, err := hb.driver.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: uids[i-lag]}}); err != nil {
				b.Fatal(err)
			}
		}
		d = append(d, time.Since(start))
	}
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, "pair-p50-ms")
	b.ReportMetric(float64(d[len(d)*99/100].Microseconds())/1000, "pair-p99-ms")
	writes := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "patch" && a.GetSubresource() == "status" {
			writes++
		}
	}
	b.ReportMetric(float64(writes)/float64(len(d)), "status-writes/op")
}
