package plugin

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
)

func prepare(t *testing.T, h *harness, claims ...*resourceapi.ResourceClaim) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	res, err := h.driver.PrepareResourceClaims(ctx, claims)
	if err != nil {
		t.Fatal(err)
	}
	for uid, r := range res {
		if r.Err != nil {
			t.Fatalf("prepare %s: %v", uid, r.Err)
		}
	}
}

func uids(m map[types.UID]checkpoint.PreparedClaim) []types.UID {
	var out []types.UID
	for u := range m {
		out = append(out, u)
	}
	slices.Sort(out)
	return out
}

func TestReconcile(t *testing.T) {
	c1 := claim("uid-1", "c1", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-1")})
	c2 := claim("uid-2", "c2", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-2")})
	c3 := claim("uid-3", "c3", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-3")})
	apiClaim := func(name, uid string) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(uid)}}
	}
	tests := []struct {
		name string
		// damage runs after c1..c3 are prepared.
		damage         func(t *testing.T, h *harness)
		inAPI          []*resourceapi.ResourceClaim
		wantPrepared   []types.UID
		wantCorrupt    bool
		wantUnprepared []types.UID
		wantRebooted   []types.UID
	}{
		{
			name:         "all claims exist: nothing changes",
			inAPI:        []*resourceapi.ResourceClaim{c1, c2, c3},
			wantPrepared: []types.UID{"uid-1", "uid-2", "uid-3"},
		},
		{
			name:           "deleted claim and replaced claim are unprepared",
			inAPI:          []*resourceapi.ResourceClaim{c1, apiClaim("c2", "uid-2-new")},
			wantPrepared:   []types.UID{"uid-1"},
			wantUnprepared: []types.UID{"uid-2", "uid-3"},
		},
		{
			name: "orphan spec from a crashed prepare is removed",
			damage: func(t *testing.T, h *harness) {
				if err := h.cdi.Write(checkpoint.PreparedClaim{UID: "uid-crashed", Namespace: "ns", Name: "x", Devices: []checkpoint.PreparedDevice{{Request: "gpu", Pool: testNode, Device: "gpu-4", Index: 4, CDIDevice: "uid-crashed-gpu-4"}}}); err != nil {
					t.Fatal(err)
				}
			},
			inAPI:        []*resourceapi.ResourceClaim{c1, c2, c3},
			wantPrepared: []types.UID{"uid-1", "uid-2", "uid-3"},
		},
		{
			name: "missing spec of a checkpointed claim is restored",
			damage: func(t *testing.T, h *harness) {
				if err := os.Remove(h.cdi.SpecPath("uid-2")); err != nil {
					t.Fatal(err)
				}
			},
			inAPI:        []*resourceapi.ResourceClaim{c1, c2, c3},
			wantPrepared: []types.UID{"uid-1", "uid-2", "uid-3"},
		},
		{
			name: "corrupt checkpoint is moved aside and rebuilt from the specs",
			damage: func(t *testing.T, h *harness) {
				if err := os.WriteFile(h.store.Path(), []byte(`{"version":"gpu.example.com/checkpoint/v2","checksum":"sha256:0","data":{}}`), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			inAPI:          []*resourceapi.ResourceClaim{c1, c3},
			wantCorrupt:    true,
			wantPrepared:   []types.UID{"uid-1", "uid-3"},
			wantUnprepared: []types.UID{"uid-2"},
		},
		{
			name: "after a reboot nothing is prepared any more, although the claims exist",
			damage: func(t *testing.T, h *harness) {
				h.driver.store = checkpoint.NewStore(h.dir, checkpoint.WithBootID("boot-after-reboot"))
				h.store = h.driver.store
			},
			inAPI:        []*resourceapi.ResourceClaim{c1, c2, c3},
			wantRebooted: []types.UID{"uid-1", "uid-2", "uid-3"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			_, ctx := ktesting.NewTestContext(t)
			prepare(t, h, c1, c2, c3)
			before, _ := h.driver.PreparedClaims(ctx)
			if tc.damage != nil {
				tc.damage(t, h)
			}
			client := fake.NewClientset()
			for _, c := range tc.inAPI {
				if _, err := client.ResourceV1().ResourceClaims(c.Namespace).Create(ctx, c, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			res, err := h.driver.Reconcile(ctx, client.ResourceV1())
			if err != nil {
				t.Fatal(err)
			}
			if (res.Corrupt != nil) != tc.wantCorrupt {
				t.Errorf("corrupt = %v, want %v", res.Corrupt, tc.wantCorrupt)
			}
			if tc.wantCorrupt {
				moved, _ := filepath.Glob(h.store.Path() + ".corrupt-*")
				if len(moved) != 1 {
					t.Errorf("corrupt checkpoint not moved aside: %v", moved)
				}
			}
			slices.Sort(res.Unprepared)
			if !slices.Equal(res.Unprepared, tc.wantUnprepared) {
				t.Errorf("unprepared %v, want %v", res.Unprepared, tc.wantUnprepared)
			}
			slices.Sort(res.Rebooted)
			if !slices.Equal(res.Rebooted, tc.wantRebooted) {
				t.Errorf("dropped after reboot %v, want %v", res.Rebooted, tc.wantRebooted)
			}
			after, err := h.driver.PreparedClaims(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got := uids(after); !slices.Equal(got, tc.wantPrepared) {
				t.Errorf("checkpoint holds %v, want %v", got, tc.wantPrepared)
			}
			specs, _ := h.cdi.List()
			if !slices.Equal(specs, tc.wantPrepared) {
				t.Errorf("CDI specs %v, want exactly the checkpoint %v", specs, tc.wantPrepared)
			}
			for _, uid := range tc.wantPrepared {
				if got, want := after[uid], before[uid]; got.Name != want.Name || len(got.Devices) != len(want.Devices) || !apiequality.Semantic.DeepEqual(got.Devices[0], want.Devices[0]) {
					t.Errorf("entry %s = %+v, want %+v", uid, got, want)
				}
			}
		})
	}
}

// A lookup error other than NotFound must not unprepare: the claim may well still be in use.
func TestReconcileKeepsClaimsOnAPIErrors(t *testing.T) {
	h := newHarness(t)
	_, ctx := ktesting.NewTestContext(t)
	prepare(t, h, claim("uid-1", "c1", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-1")}))
	client := fake.NewClientset()
	client.PrependReactor("get", "resourceclaims", func(action k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	res, err := h.driver.Reconcile(ctx, client.ResourceV1())
	if err != nil {
		t.Fatal(err)
	}
	if res.Prepared != 1 || len(res.Unprepared) != 0 {
		t.Errorf("result %+v, want the claim kept", res)
	}
}
