package scale

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

func TestClaimsFor(t *testing.T) {
	for _, tc := range []struct {
		fraction float64
		devices  int
		want     int
		err      string
	}{
		{0, 40_000, 0, ""},
		{1, 40_000, 40_000, ""},
		{0.5, 800, 400, ""},
		{0.3333, 3, 1, ""},
		{1, maxClaims, maxClaims, ""},
		{1, maxClaims + 1, 0, "at most"},
		{1.01, 800, 0, "0 to 1"},
		{-0.1, 800, 0, "0 to 1"},
		{math.NaN(), 800, 0, "0 to 1"},
		{math.Inf(1), 800, 0, "0 to 1"},
	} {
		t.Run(fmt.Sprintf("%v of %d", tc.fraction, tc.devices), func(t *testing.T) {
			got, err := claimsFor(tc.fraction, tc.devices)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "--claims") {
					t.Fatalf("error %v, want one naming --claims and %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestSpread(t *testing.T) {
	d := func(node, dev string) deviceRef { return deviceRef{Node: node, Pool: node, Device: dev} }
	for _, tc := range []struct {
		name      string
		in, want  []deviceRef
		wantNodes int // distinct nodes among the first len(nodes) devices
	}{
		{"empty", nil, []deviceRef{}, 0},
		{
			"nodes take turns, devices in order",
			[]deviceRef{d("b", "gpu-1"), d("a", "gpu-1"), d("b", "gpu-0"), d("a", "gpu-0"), d("c", "gpu-0")},
			[]deviceRef{d("a", "gpu-0"), d("b", "gpu-0"), d("c", "gpu-0"), d("a", "gpu-1"), d("b", "gpu-1")},
			3,
		},
		{
			"one node",
			[]deviceRef{d("a", "gpu-2"), d("a", "gpu-0"), d("a", "gpu-1")},
			[]deviceRef{d("a", "gpu-0"), d("a", "gpu-1"), d("a", "gpu-2")},
			1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := spread(tc.in)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("spread: %v\nwant %v", got, tc.want)
			}
			nodes := map[string]bool{}
			for _, x := range tc.in {
				nodes[x.Node] = true
			}
			first := map[string]bool{}
			for _, x := range got[:len(nodes)] {
				first[x.Node] = true
			}
			if len(first) != tc.wantNodes {
				t.Errorf("the first %d devices are on %d nodes, want %d", len(nodes), len(first), tc.wantNodes)
			}
		})
	}
}

func TestChurnStep(t *testing.T) {
	for _, tc := range []struct {
		changes, claims int
		want            string // claim and a (allocate) or d, step by step
	}{
		{6, 10, "0d 1d 2d 0a 1a 2a"},
		{7, 10, "0d 1d 2d 3d 0a 1a 2a"},
		{6, 2, "0d 1d 0a 1a 0d 1d"},
		{2, 1, "0d 0a"},
		{1, 5, "0d"},
		{3, 0, "0d 0a 0d"},
	} {
		t.Run(fmt.Sprintf("%d changes, %d claims", tc.changes, tc.claims), func(t *testing.T) {
			var steps []string
			for i := range tc.changes {
				c, a := churnStep(i, tc.changes, tc.claims)
				steps = append(steps, fmt.Sprintf("%d%s", c, map[bool]string{true: "a", false: "d"}[a]))
			}
			if got := strings.Join(steps, " "); got != tc.want {
				t.Errorf("steps %q, want %q", got, tc.want)
			}
		})
	}
}

func TestAllocationPatch(t *testing.T) {
	dealloc, err := allocationPatch(nil)
	if err != nil || string(dealloc) != `{"status":{"allocation":null}}` {
		t.Errorf("deallocation patch %s, %v", dealloc, err)
	}
	alloc, err := allocationPatch(allocation("gpu.example.com", deviceRef{Node: "n-1", Pool: "n-1", Device: "gpu-3"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"request":"gpu"`, `"driver":"gpu.example.com"`, `"pool":"n-1"`, `"device":"gpu-3"`, `"key":"metadata.name","operator":"In","values":["n-1"]`} {
		if !strings.Contains(string(alloc), want) {
			t.Errorf("allocation patch %s lacks %s", alloc, want)
		}
	}
}

// TestHolder: a real kube-apiserver takes the held claims with the allocations the holder writes
// (its validation of status.allocation), as the controller-manager the holder acts as, and a churn
// leaves every claim allocated to its device again.
func TestHolder(t *testing.T) {
	s := testapiserver.Start(t)
	ctx := context.Background()
	cfg := rest.CopyConfig(s.Config)
	cfg.Impersonate = controllerManager
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var devices []deviceRef
	for n := range 3 {
		for g := range 2 {
			node := NodeName(n)
			devices = append(devices, deviceRef{Node: node, Pool: node, Device: fmt.Sprintf("gpu-%d", g)})
		}
	}
	h := &holder{cs: cs, driver: "gpu.example.com", class: "gpu.example.com", workers: 4, devices: spread(devices), claims: 5}
	if err := h.write(ctx); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		for i := range h.claims {
			c := heldClaim(i, h.class)
			got, err := s.Clientset.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			a := got.Status.Allocation
			if a == nil || len(a.Devices.Results) != 1 || a.Devices.Results[0].Device != h.devices[i].Device || a.Devices.Results[0].Pool != h.devices[i].Pool ||
				a.NodeSelector.NodeSelectorTerms[0].MatchFields[0].Values[0] != h.devices[i].Node {
				t.Errorf("%s: claim %s/%s allocation %+v, want %+v", when, c.Namespace, c.Name, a, h.devices[i])
			}
		}
	}
	check("written")
	if err := h.set(ctx, 0, false); err != nil {
		t.Fatal(err)
	}
	c := heldClaim(0, h.class)
	if got, err := s.Clientset.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{}); err != nil || got.Status.Allocation != nil {
		t.Fatalf("deallocated claim: %v, %v", got.Status.Allocation, err)
	}
	res, err := h.churn(ctx, 100, 7)
	if err != nil || res.Failed > 0 || res.Sent != 7 {
		t.Fatalf("churn: %d sent, %d failed (%s), restore: %v", res.Sent, res.Failed, res.FirstErr, err)
	}
	check("after the churn")
	nss, err := s.Clientset.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, ns := range nss.Items {
		if strings.HasPrefix(ns.Name, "scale-claims-") && ns.Status.Phase == corev1.NamespaceActive {
			held++
		}
	}
	if held != 5 {
		t.Errorf("claims spread over %d namespaces, want 5", held)
	}
}

// TestOverBySecond: the answers slower than the deadline, counted by the second they were sent
// in, up to the last second with one; an answer at the deadline is in time.
func TestOverBySecond(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name    string
		answers []answer
		want    []int
	}{
		{name: "none", answers: nil, want: nil},
		{name: "all in time", answers: []answer{{At: 0, Lat: 5 * ms}, {At: 1500 * ms, Lat: 100 * ms}}, want: nil},
		{name: "late in the third second", answers: []answer{{At: 10 * ms, Lat: 5 * ms}, {At: 2100 * ms, Lat: 101 * ms}, {At: 2999 * ms, Lat: time.Second}}, want: []int{0, 0, 2}},
		{name: "late in the first and third", answers: []answer{{At: 0, Lat: 200 * ms}, {At: 2 * time.Second, Lat: 200 * ms}, {At: 3 * time.Second, Lat: ms}}, want: []int{1, 0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := overBySecond(&result{Answers: tc.answers}, 100*ms); !slices.Equal(got, tc.want) {
				t.Errorf("overBySecond = %v, want %v", got, tc.want)
			}
		})
	}
}
