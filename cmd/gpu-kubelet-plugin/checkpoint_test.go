package main_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
)

// prepareAsKubelet retries a failed prepare as the kubelet does for a pod that cannot start yet.
func (k *kubelet) prepareAsKubelet(ctx context.Context, claim *resourceapi.ResourceClaim) (prepared, error) {
	var err error
	for range 3 {
		var res map[types.UID]prepared
		if res, err = k.prepare(ctx, claim); err == nil {
			return res[claim.UID], nil
		}
	}
	return nil, err
}

// TestCorruptCheckpointWhileServing damages the checkpoint of a serving plugin between two
// prepares. The plugin must rebuild what is prepared from the CDI specs before it answers again:
// the second claim, allocated the first one's GPU, is refused however often the kubelet retries,
// and after a restart the first claim is still prepared (its spec is no orphan).
func TestCorruptCheckpointWhileServing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := newCluster(t, v1Only, nil)
	p := c.startPlugin(t, "")
	k := p.register(ctx, false)

	first := c.allocatedClaim(t, ctx, "first", []string{"gpu-0"})
	before, err := k.prepareAsKubelet(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(c.dataDir(), "checkpoint.json")
	if err := os.WriteFile(store, []byte(`{"version":"gpu.example.com/checkpoint/v2","checksum":"sha256:0","data":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}

	// A scheduler never allocates one GPU twice; the plugin is the last line if it ever did.
	second := c.allocatedClaim(t, ctx, "second", []string{"gpu-0"})
	refused := func(when string) {
		t.Helper()
		got, err := k.prepareAsKubelet(ctx, second)
		if err == nil || !strings.Contains(err.Error(), "device node-1/gpu-0 is already prepared for claim default/first") {
			t.Errorf("%s: prepare of a second claim on gpu-0 = %v, %v; want it refused as in use", when, got, err)
		}
		if _, err := os.Stat(specPath(c, second)); !os.IsNotExist(err) {
			t.Errorf("%s: the refused claim has a CDI spec (%v)", when, err)
		}
	}
	refused("corrupt checkpoint")
	if moved, _ := filepath.Glob(store + ".corrupt-*"); len(moved) != 1 {
		t.Errorf("corrupt checkpoint not moved aside: %v", moved)
	}
	logs, _ := os.ReadFile(p.log)
	if !strings.Contains(string(logs), "Checkpoint is corrupt; rebuilding from CDI specs") || !strings.Contains(string(logs), store) {
		t.Error("corrupt checkpoint not reported with its path in the log")
	}
	if entries := c.consistent(t); len(entries) != 1 || entries[first.UID].Name != "first" {
		t.Errorf("after the rebuild the checkpoint holds %v, want the first claim", entries)
	}
	if m := scrape(t, p); !strings.Contains(m, `gpu_dra_plugin_errors_total{component="checkpoint"} 1`) {
		t.Errorf("corrupt checkpoint not counted in errors_total{component=checkpoint}")
	}

	p.kill()
	p = c.startPlugin(t, "")
	k = p.register(ctx, false)
	if _, err := os.Stat(specPath(c, first)); err != nil {
		t.Fatalf("after a restart the first claim's CDI spec is gone: %v", err)
	}
	c.consistent(t)
	if again, err := k.prepareAsKubelet(ctx, first); err != nil || !reflect.DeepEqual(again, before) {
		t.Errorf("after a restart the first claim prepares to %v, %v; the kubelet was told %v", again, err, before)
	}
	refused("after a restart")
}
