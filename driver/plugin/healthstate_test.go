package plugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra/driver/faults"
)

// healthReads are the paths that read what is prepared without the kubelet calling them: each
// must find a damaged checkpoint the way a prepare does, rebuilding it from the CDI specs.
var healthReads = []struct {
	name string
	read func(ctx context.Context, d *Driver, client *fake.Clientset)
}{
	{name: "NotifyPods", read: func(ctx context.Context, d *Driver, client *fake.Clientset) {
		d.NotifyPods(ctx, client.ResourceV1(), &recorder{}, nil, faults.Faults{"gpu-0": xid("79"), "gpu-1": xid("79"), "gpu-2": xid("79"), "gpu-3": xid("79")})
	}},
	{name: "ResyncStatus", read: func(ctx context.Context, d *Driver, _ *fake.Clientset) { _ = d.ResyncStatus(ctx) }},
}

// TestHealthReadFindsCorruptCheckpoint: when a health read is the one that finds the checkpoint
// damaged, what is prepared is rebuilt then and there; the next prepare does not take the
// moved-aside file for an empty checkpoint and give a running claim's GPU to another, and the next
// reconcile does not take the running claim's CDI spec for an orphan.
func TestHealthReadFindsCorruptCheckpoint(t *testing.T) {
	for _, tc := range healthReads {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			_, ctx := ktesting.NewTestContext(t)
			a := claim("uid-a", "a", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-1")})
			b := claim("uid-b", "b", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-1")})
			prepare(t, h, a)
			if err := os.WriteFile(h.store.Path(), []byte("{broken"), 0o600); err != nil {
				t.Fatal(err)
			}
			tc.read(ctx, h.driver, fake.NewClientset())
			if moved, _ := filepath.Glob(h.store.Path() + ".corrupt-*"); len(moved) != 1 {
				t.Fatalf("the health read did not move the corrupt checkpoint aside: %v", moved)
			}
			if err := kubeletPrepare(ctx, t, h.driver, b)[b.UID].Err; err == nil {
				t.Error("claim b got gpu-1, which running claim a holds")
			}
			if _, err := h.driver.Reconcile(ctx, nil); err != nil {
				t.Fatal(err)
			}
			if !h.cdi.Exists(a.UID) {
				t.Error("reconcile deleted the CDI spec of running claim a")
			}
		})
	}
}

// TestHealthReadsWhileServing runs the health reads without pause while the kubelet prepares and
// unprepares (its calls serialized, as the helper does) and the checkpoint is damaged now and
// then. Run with -race: the checkpoint store is not safe for concurrent use. No device is ever
// prepared for two running claims, and at the end every running claim still has its entry and its
// CDI spec.
func TestHealthReadsWhileServing(t *testing.T) {
	const (
		devices     = 4
		rounds      = 40
		damageEvery = 5
	)
	h := newHarness(t)
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset()

	stop := make(chan struct{})
	var readers sync.WaitGroup
	for _, r := range healthReads {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					r.read(ctx, h.driver, client)
				}
			}
		})
	}

	running := map[string]*resourceapi.ResourceClaim{} // by device
	for round := range rounds {
		if round > 0 && round%damageEvery == 0 {
			damageAndWait(t, h.store.Path(), round/damageEvery)
		}
		dev := fmt.Sprintf("gpu-%d", round%devices)
		c := claim(fmt.Sprintf("uid-%d", round), fmt.Sprintf("c%d", round), []resourceapi.DeviceRequestAllocationResult{result("gpu", dev)})
		holder := running[dev]
		err := kubeletPrepare(ctx, t, h.driver, c)[c.UID].Err
		switch {
		case holder != nil && err == nil:
			t.Errorf("round %d: %s prepared for claim %s while running claim %s holds it", round, dev, c.Name, holder.Name)
			running[dev] = c
			continue
		case holder == nil && err != nil:
			t.Errorf("round %d: free %s refused to claim %s: %v", round, dev, c.Name, err)
			continue
		case holder == nil:
			running[dev] = c
			continue
		}
		// The device is taken: its claim ends, and the new one gets it.
		if err := kubeletUnprepare(ctx, t, h.driver, holder)[holder.UID]; err != nil {
			t.Errorf("round %d: unprepare %s: %v", round, holder.Name, err)
		}
		delete(running, dev)
		if err := kubeletPrepare(ctx, t, h.driver, c)[c.UID].Err; err != nil {
			t.Errorf("round %d: %s, released by %s, refused to claim %s: %v", round, dev, holder.Name, c.Name, err)
			continue
		}
		running[dev] = c
	}
	close(stop)
	readers.Wait()

	if _, err := h.driver.Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	prepared, err := h.driver.PreparedClaims(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for dev, c := range running {
		if _, ok := prepared[c.UID]; !ok {
			t.Errorf("running claim %s (%s) lost its checkpoint entry", c.Name, dev)
		}
		if !h.cdi.Exists(c.UID) {
			t.Errorf("running claim %s (%s) lost its CDI spec", c.Name, dev)
		}
	}
	holders := map[string]types.UID{}
	for uid, c := range prepared {
		for _, d := range c.Devices {
			if other, ok := holders[d.Device]; ok {
				t.Errorf("checkpoint gives %s to %s and %s", d.Device, other, uid)
			}
			holders[d.Device] = uid
		}
	}
}

// damageAndWait overwrites the checkpoint with garbage and waits until a health read has found it
// (the n-th file moved aside), so that the health path, not the next prepare, meets the damage.
func damageAndWait(t *testing.T, path string, n int) {
	t.Helper()
	if err := os.WriteFile(path, []byte("{broken"), 0o600); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if moved, _ := filepath.Glob(path + ".corrupt-*"); len(moved) >= n {
			return
		}
	}
	t.Fatalf("no health read found the damaged checkpoint %d within 5s", n)
}
