package fleetmetrics

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra/internal/analysis/diagnosis"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
)

// largeFleet is the scale the webhook is sized for: 5,000 nodes of 8 GPUs of two models, 40,000
// claims, every other one holding a GPU (every pool busy: the fleet lists each device) and the
// rest pending; built as diagnosis.Held builds it.
func largeFleet(b *testing.B) diagnosis.Rebuilt {
	b.Helper()
	var published []*resourceapi.ResourceSlice
	var claims []*resourceapi.ResourceClaim
	for n := range 5000 {
		node := fmt.Sprintf("node-%04d", n)
		published = append(published, gpus(driver, node, 1, repeat([]string{"A100", "H100"}[n%2], 8)...))
		for d := range 8 {
			name := fmt.Sprintf("c-%04d-%d", n, d)
			if d%2 == 0 {
				claims = append(claims, allocated(name, node, fmt.Sprintf("gpu-%d", d)))
			} else {
				claims = append(claims, pending(name, time.Duration(n)*time.Second, d%4 == 1))
			}
		}
	}
	kept := make([]*inventory.Claim, len(claims))
	uses := make([]*deviceusage.Claim, len(claims))
	for i, c := range claims {
		kept[i] = inventory.KeepClaim(c)
		uses[i] = &kept[i].Claim
	}
	slices := inventory.Compact(inventory.NewInterner(), published)
	keptSlices := make([]*resourceapi.ResourceSlice, len(slices))
	for i, sl := range slices {
		keptSlices[i] = &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: sl.Name}, Spec: sl.Spec.Published()}
	}
	fl := deviceusage.Build(deviceusage.Input{Slices: keptSlices, Kept: uses, BusyPoolsOnly: true})
	return diagnosis.Rebuilt{Slices: slices, Fleet: fl, Claims: kept}
}

// BenchmarkObserve is what the sums add to each rebuild of the index at that scale.
func BenchmarkObserve(b *testing.B) {
	r := largeFleet(b)
	c := New(driver)
	b.ReportAllocs()
	for b.Loop() {
		c.Observe(r)
	}
}

// BenchmarkCollect is one scrape of the fleet gauges at that scale.
func BenchmarkCollect(b *testing.B) {
	c := New(driver)
	c.Observe(largeFleet(b))
	ch := make(chan prometheus.Metric, 64)
	done := make(chan struct{})
	go func() {
		for range ch {
		}
		close(done)
	}()
	b.ReportAllocs()
	for b.Loop() {
		c.Collect(ch)
	}
	close(ch)
	<-done
}
