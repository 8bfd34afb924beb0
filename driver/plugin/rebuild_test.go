package plugin

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// asKubelet calls prepare or unprepare as the kubelet does: a failure of the whole call is retried
// (the kubelet keeps the pod waiting and calls again), a failure of one claim is that claim's answer.
func asKubelet[T any](t *testing.T, call func() (T, error)) T {
	t.Helper()
	var lastErr error
	for range 3 {
		res, err := call()
		if err == nil {
			return res
		}
		lastErr = err
	}
	t.Fatalf("failed three times: %v", lastErr)
	var zero T
	return zero
}

func kubeletPrepare(ctx context.Context, t *testing.T, d *Driver, claims ...*resourceapi.ResourceClaim) map[types.UID]kubeletplugin.PrepareResult {
	t.Helper()
	return asKubelet(t, func() (map[types.UID]kubeletplugin.PrepareResult, error) { return d.PrepareResourceClaims(ctx, claims) })
}

func kubeletUnprepare(ctx context.Context, t *testing.T, d *Driver, claims ...*resourceapi.ResourceClaim) map[types.UID]error {
	t.Helper()
	refs := make([]kubeletplugin.NamespacedObject, 0, len(claims))
	for _, c := range claims {
		refs = append(refs, kubeletplugin.NamespacedObject{UID: c.UID, NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}})
	}
	return asKubelet(t, func() (map[types.UID]error, error) { return d.UnprepareResourceClaims(ctx, refs) })
}

// A checkpoint that turns corrupt while the plugin serves is not an empty one: before the plugin
// answers the next prepare or unprepare it rebuilds its state from the CDI specs, as at start. A
// device prepared for one claim is refused to another, and a restart keeps every claim that was
// prepared (its spec is no orphan).
func TestCorruptCheckpointWhileServing(t *testing.T) {
	a := claim("uid-a", "a", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-1")})
	c := claim("uid-c", "c", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-2")})
	// b asks for a's device: the scheduler never does this, the plugin is the last line.
	b := claim("uid-b", "b", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-1")})
	d := claim("uid-d", "d", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-3")})

	replace := func(old, new string) func([]byte) []byte {
		return func(raw []byte) []byte { return bytes.Replace(raw, []byte(old), []byte(new), 1) }
	}
	corruptions := map[string]func(raw []byte) []byte{
		"garbage":       func([]byte) []byte { return []byte("{broken") },
		"truncated":     func(raw []byte) []byte { return raw[:len(raw)/2] },
		"wrong version": replace("checkpoint/v2", "checkpoint/v9"),
		"bit flip":      replace(`"gpu-2"`, `"gpu-5"`),
	}
	tests := []struct {
		name string
		// serve runs after the corruption and returns the claims prepared afterwards.
		serve func(ctx context.Context, t *testing.T, h *harness) []types.UID
	}{
		{
			name: "a second claim on a prepared device is refused",
			serve: func(ctx context.Context, t *testing.T, h *harness) []types.UID {
				res := kubeletPrepare(ctx, t, h.driver, b, d)
				if err := res[b.UID].Err; err == nil || !strings.Contains(err.Error(), "device node-a/gpu-1 is already prepared for claim ns/a (uid uid-a)") {
					t.Errorf("claim b on a's gpu-1: %v, want it refused as in use", err)
				}
				if err := res[d.UID].Err; err != nil {
					t.Errorf("claim d on a free GPU: %v", err)
				}
				if h.cdi.Exists(b.UID) {
					t.Error("refused claim b got a CDI spec")
				}
				return []types.UID{a.UID, c.UID, d.UID}
			},
		},
		{
			name: "a repeated prepare returns what was prepared",
			serve: func(ctx context.Context, t *testing.T, h *harness) []types.UID {
				res := kubeletPrepare(ctx, t, h.driver, a)
				if r := res[a.UID]; r.Err != nil || len(r.Devices) != 1 || r.Devices[0].DeviceName != "gpu-1" {
					t.Errorf("prepare of a again = %+v, want gpu-1 as before", r)
				}
				return []types.UID{a.UID, c.UID}
			},
		},
		{
			name: "unprepare of one claim keeps the others",
			serve: func(ctx context.Context, t *testing.T, h *harness) []types.UID {
				if err := kubeletUnprepare(ctx, t, h.driver, c)[c.UID]; err != nil {
					t.Errorf("unprepare c: %v", err)
				}
				// gpu-2 is free again, gpu-1 is not.
				res := kubeletPrepare(ctx, t, h.driver, claim("uid-e", "e", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-2")}), b)
				if err := res["uid-e"].Err; err != nil {
					t.Errorf("claim e on the released gpu-2: %v", err)
				}
				if err := res[b.UID].Err; err == nil {
					t.Error("claim b on a's gpu-1 was prepared")
				}
				return []types.UID{a.UID, "uid-e"}
			},
		},
	}
	for _, tc := range tests {
		for cname, corrupt := range corruptions {
			t.Run(tc.name+"/"+cname, func(t *testing.T) {
				h := newHarness(t)
				_, ctx := ktesting.NewTestContext(t)
				prepare(t, h, a, c)
				raw, err := os.ReadFile(h.store.Path())
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(h.store.Path(), corrupt(raw), 0o600); err != nil {
					t.Fatal(err)
				}

				want := tc.serve(ctx, t, h)
				slices.Sort(want)
				if moved, _ := filepath.Glob(h.store.Path() + ".corrupt-*"); len(moved) != 1 {
					t.Errorf("corrupt checkpoint not moved aside once: %v", moved)
				}
				checkPrepared(t, h, want)

				// A restart, with every claim still in the API server.
				restarted := h.restart(t)
				client := fake.NewClientset()
				for _, cl := range []*resourceapi.ResourceClaim{a, b, c, d, claim("uid-e", "e", nil)} {
					if _, err := client.ResourceV1().ResourceClaims(cl.Namespace).Create(ctx, cl, metav1.CreateOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				res, err := restarted.driver.Reconcile(ctx, client.ResourceV1())
				if err != nil {
					t.Fatal(err)
				}
				if len(res.RemovedOrphans) != 0 || len(res.Unprepared) != 0 || res.Corrupt != nil {
					t.Errorf("restart after the rebuild changed something: %+v", res)
				}
				checkPrepared(t, restarted, want)
			})
		}
	}
}

// checkPrepared says that exactly want is prepared: checkpoint entries and CDI specs alike.
func checkPrepared(t *testing.T, h *harness, want []types.UID) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	got, err := h.driver.PreparedClaims(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(uids(got), want) {
		t.Errorf("checkpoint holds %v, want %v", uids(got), want)
	}
	if specs, _ := h.cdi.List(); !slices.Equal(specs, want) {
		t.Errorf("CDI specs %v, want %v", specs, want)
	}
	for uid, c := range got {
		if spec, err := h.cdi.Read(uid); err != nil || !equalClaims(spec, c) {
			t.Errorf("spec of %s = %+v (%v), entry %+v", uid, spec, err, c)
		}
	}
}

func equalClaims(a, b checkpoint.PreparedClaim) bool {
	return apiequality.Semantic.DeepEqual(a, b)
}

// restart is a new plugin process on the same node: same CDI directory and data directory.
func (h *harness) restart(t *testing.T) *harness {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	store := checkpoint.NewStore(h.dir)
	d, err := NewDriver(ctx, testDriver, testNode, simulated.New(testNode, nodegroups.GroupSpec{}), h.cdi, store)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{driver: d, cdi: h.cdi, store: store, dir: h.dir}
}
