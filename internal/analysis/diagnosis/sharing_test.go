package diagnosis

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility/feasibilitytest"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// sharingCluster is what the simulated driver publishes for three nodes: one of shared-memory
// GPUs, one of a partitioned GPU (its counter set in a slice of its own, the 1.35+ layout) and
// one of exclusive GPUs (see testdata/sharing.yaml).
func sharingCluster(t *testing.T) *inventory.Objects {
	t.Helper()
	st := &inventory.Objects{Classes: feasibilitytest.Classes()}
	small := resource.MustParse("40Gi")
	for _, n := range []struct {
		name string
		spec nodegroups.GroupSpec
	}{
		{"shared-0", nodegroups.GroupSpec{Count: 2, Sharing: &nodegroups.Sharing{Mode: nodegroups.SharedMemory}}},
		{"parts-0", nodegroups.GroupSpec{Count: 1, Sharing: &nodegroups.Sharing{Mode: nodegroups.Partitioned, Partitions: 4}}},
		{"whole-0", nodegroups.GroupSpec{Count: 2, Model: "SMALL-GPU", Memory: &small}},
	} {
		st.Nodes = append(st.Nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}})
		gpus := simulated.New(n.name, n.spec)
		devices, err := gpus.Devices(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		sets, err := gpus.SharedCounters(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		count := int64(1)
		if len(sets) > 0 {
			count = 2
			st.Slices = append(st.Slices, &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: n.name + "-counters"},
				Spec: resourceapi.ResourceSliceSpec{Driver: feasibilitytest.Driver, NodeName: ptr.To(n.name), Pool: resourceapi.ResourcePool{Name: n.name, ResourceSliceCount: count}, SharedCounters: sets}})
		}
		st.Slices = append(st.Slices, &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: n.name + "-gpus"},
			Spec: resourceapi.ResourceSliceSpec{Driver: feasibilitytest.Driver, NodeName: ptr.To(n.name), Pool: resourceapi.ResourcePool{Name: n.name, ResourceSliceCount: count}, Devices: devices}})
	}
	return st
}

// fakeServed answers as an API server with the given gates would.
type fakeServed struct {
	consumable bool
	err        error
}

func (f fakeServed) ConsumableCapacity(context.Context) (bool, error) { return f.consumable, f.err }
func (f fakeServed) PartitionableDevices(_ context.Context, slices []*resourceapi.ResourceSlice) bool {
	return slices[0] != nil // every fixture slice set has counters
}

// claimList is a fixed ClaimLister.
type claimList []*resourceapi.ResourceClaim

func (c claimList) Claims() ([]*inventory.Claim, error) {
	out := make([]*inventory.Claim, len(c))
	for i, cl := range c {
		out[i] = inventory.KeepClaim(cl)
	}
	return out, nil
}

// heldClaims makes one allocated claim per entry: node/device to the capacity it consumes (a
// share when any, else the whole device), reserved for a pod.
func heldClaims(t *testing.T, held map[string][]string) claimList {
	t.Helper()
	keys := make([]string, 0, len(held))
	for k := range held {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out claimList
	for i, k := range keys {
		node, device, _ := strings.Cut(k, "/")
		r := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: feasibilitytest.Driver, Pool: node, Device: device}
		for _, c := range held[k] {
			name, q, ok := strings.Cut(c, "=")
			if !ok {
				t.Fatalf("held %s: %q is not name=quantity", k, c)
			}
			if r.ConsumedCapacity == nil {
				r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{}
				r.ShareID = ptr.To(types.UID(fmt.Sprintf("share-%d", i)))
			}
			r.ConsumedCapacity[resourceapi.QualifiedName(name)] = resource.MustParse(q)
		}
		out = append(out, &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("holder-%d", i), Namespace: "default"},
			Status: resourceapi.ResourceClaimStatus{
				Allocation:  &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{r}}},
				ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: fmt.Sprintf("pod-%d", i), UID: "u"}},
			},
		})
	}
	return out
}

type sharingCase struct {
	Name                 string                        `json:"name"`
	NoConsumableCapacity bool                          `json:"noConsumableCapacity"`
	Message              string                        `json:"message"`
	Held                 map[string][]string           `json:"held"`
	HeldNow              string                        `json:"heldNow"`
	Spec                 resourceapi.ResourceClaimSpec `json:"spec"`
}

// TestSharing judges claims for shares, partitions and capacity against the simulated driver's
// shared-memory, partitioned and exclusive GPUs with the features the API server serves, first
// against the published devices (Unsatisfiable: the same answer whatever is allocated), then
// against what the held claims leave free (HeldNow).
func TestSharing(t *testing.T) {
	st := sharingCluster(t)
	for _, tc := range feasibilitytest.LoadCases[sharingCase](t, "sharing.yaml") {
		t.Run(tc.Name, func(t *testing.T) {
			ctx := context.Background()
			spec := tc.Spec.DeepCopy()
			resourceversion.Default(spec)
			view := feasibility.New(st, celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema()),
				feasibility.WithServed(fakeServed{consumable: !tc.NoConsumableCapacity}), feasibility.WithTimeout(time.Minute))
			held := NewHeld(view, heldClaims(t, tc.Held))
			for range 2 { // the second answer comes from the caches
				msg, err := view.Unsatisfiable(ctx, "default", spec)
				if err != nil {
					t.Fatal(err)
				}
				if msg != tc.Message {
					t.Fatalf("Unsatisfiable:\n got: %q\nwant: %q", msg, tc.Message)
				}
				if msg != "" {
					continue
				}
				heldNow, err := held.HeldNow(ctx, "default", spec)
				if err != nil {
					t.Fatal(err)
				}
				if (heldNow == "") != (tc.HeldNow == "") || !strings.Contains(heldNow, tc.HeldNow) {
					t.Fatalf("HeldNow:\n got: %q\nwant: %q", heldNow, tc.HeldNow)
				}
			}
		})
	}
}
