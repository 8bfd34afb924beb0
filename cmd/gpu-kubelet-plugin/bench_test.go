package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BenchmarkPrepareUnprepare measures one claim's NodePrepareResources + NodeUnprepareResources
// through the real DRA socket of the plugin process (which reads the claim from a real API server,
// writes the CDI spec and saves the checkpoint), and the plugin's RSS with 100 prepared claims.
// As on a node, the CDI specs go to tmpfs (/var/run/cdi there, /dev/shm here) and the checkpoint
// to the disk. The API server read is measured on its own too (api-get-*): the kubeletplugin
// library does one per claim, and it is the floor under every prepare. Then testdata/floor, a
// plugin of the libraries alone, goes through the same steps (floor-*).
//
//	KUBEBUILDER_ASSETS=... go test ./cmd/gpu-kubelet-plugin -run '^$' -bench PrepareUnprepare
func BenchmarkPrepareUnprepare(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := newCluster(b, v1Only, nil)
	if shm, err := os.MkdirTemp("/dev/shm", "gkp-cdi"); err == nil {
		b.Cleanup(func() { _ = os.RemoveAll(shm) })
		c.cdiRoot = shm
	} else {
		b.Logf("no /dev/shm (%v): CDI specs on %s, slower than a node's tmpfs", err, c.cdiRoot)
	}
	// Back-to-back prepares exceed the default client limit of 50 QPS (the kubelet's own default),
	// which would measure the rate limiter instead of the plugin; real nodes prepare far less often.
	p := c.startPlugin(b, "", "-v=0", c.nodeGroups(b, 128), "--kube-api-qps=1000", "--kube-api-burst=1000")
	k := p.register(ctx, false)
	const pool = 100
	claims := make([]*resourceapi.ResourceClaim, pool)
	for i := range claims {
		claims[i] = c.allocatedClaim(b, ctx, fmt.Sprintf("bench-%d", i), []string{fmt.Sprintf("gpu-%d", i)})
	}

	var get []time.Duration
	for i := range 1000 {
		start := time.Now()
		if _, err := c.claims.ResourceClaims(namespace).Get(ctx, claims[i%pool].Name, metav1.GetOptions{}); err != nil {
			b.Fatal(err)
		}
		get = append(get, time.Since(start))
	}
	var prep, unprep []time.Duration
	cycles := 0
	for b.Loop() {
		p, u := cycle(b, ctx, k, claims[cycles%pool])
		prep, unprep = append(prep, p), append(unprep, u)
		cycles++
	}
	b.StopTimer()
	report := func(name string, d []time.Duration) {
		slices.Sort(d)
		b.ReportMetric(ms(d[len(d)/2]), name+"-p50-ms")
		b.ReportMetric(ms(d[(len(d)*99)/100]), name+"-p99-ms")
	}
	report("api-get", get)
	report("prepare", prep)
	report("unprepare", unprep)
	rss, anon := rssWith(b, ctx, p, k, claims)
	b.ReportMetric(rss, "rss-MiB-100-claims")
	b.ReportMetric(anon, "rss-anon-MiB-100-claims")
	if entries := c.consistent(b); len(entries) != pool {
		b.Fatalf("%d claims prepared, want %d", len(entries), pool)
	}

	// The floor: the libraries alone (testdata/floor), the same claims, the same number of
	// cycles, the same measurement. What the plugin costs beyond it is what its own code adds.
	p.kill()
	floor := filepath.Join(binDir, "floor")
	if err := buildBinary("./testdata/floor", floor); err != nil {
		b.Fatal(err)
	}
	fp := c.startBinary(b, floor, "", "--kube-api-qps=1000", "--kube-api-burst=1000")
	fk := fp.register(ctx, false)
	prep, unprep = prep[:0], unprep[:0]
	for i := range cycles {
		p, u := cycle(b, ctx, fk, claims[i%pool])
		prep, unprep = append(prep, p), append(unprep, u)
	}
	report("floor-prepare", prep)
	report("floor-unprepare", unprep)
	rss, anon = rssWith(b, ctx, fp, fk, claims)
	b.ReportMetric(rss, "floor-rss-MiB-100-claims")
	b.ReportMetric(anon, "floor-rss-anon-MiB-100-claims")
}

// cycle prepares and unprepares one claim through the kubelet's gRPC calls.
func cycle(b *testing.B, ctx context.Context, k *kubelet, claim *resourceapi.ResourceClaim) (prepare, unprepare time.Duration) {
	start := time.Now()
	if _, err := k.prepare(ctx, claim); err != nil {
		b.Fatal(err)
	}
	mid := time.Now()
	if err := k.unprepare(ctx, claim); err != nil {
		b.Fatal(err)
	}
	return mid.Sub(start), time.Since(mid)
}

// rssWith prepares all claims and returns p's RSS and its anonymous part. VmRSS counts the
// binary's file-backed pages the kernel mapped in (shared page cache) as well as the process's own
// anonymous memory; the split lets the number be read correctly.
func rssWith(b *testing.B, ctx context.Context, p *plugin, k *kubelet, claims []*resourceapi.ResourceClaim) (rss, anon float64) {
	if _, err := k.prepare(ctx, claims...); err != nil {
		b.Fatal(err)
	}
	rss, err := procStatusMiB(p.cmd.Process.Pid, "VmRSS:")
	if err != nil {
		b.Fatal(err)
	}
	anon, err = procStatusMiB(p.cmd.Process.Pid, "RssAnon:")
	if err != nil {
		b.Fatal(err)
	}
	return rss, anon
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func procStatusMiB(pid int, field string) (float64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}
