package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	draclient "k8s.io/dynamic-resource-allocation/client"

	"github.com/gpu-dra/gpu-dra/driver/cdi"
	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// pluginDataDir is the plugin's directory on the node (checkpoint, DRA sockets), as the chart
// mounts it.
const pluginDataDir = "/var/lib/kubelet/plugins/" + driver

// TestPluginRestart deletes the plugin's pod while a pod holds a GPU, as `kubectl delete pod`, an
// eviction or a liveness kill do: SIGTERM, and no successor until the DaemonSet makes one. The
// node's slice must stay as it is (kubelet 1.33+; the 1.32 kubelet deletes it itself and it comes
// back), the running pod keep its GPU, a new pod get another one, and the new plugin unprepare the
// first pod's claim when it ends. A node the DaemonSet no longer selects loses its slice through
// the kubelet, and `helm uninstall` leaves no slice at once.
func TestPluginRestart(t *testing.T) {
	c := framework.Setup(t)
	c.RequireLocal(t, "reads the plugin's CDI specs and checkpoint on the node")
	ctx := context.Background()
	version := c.NewestResourceVersion(t)
	rel := installRelease(t, c, version)
	claims := draclient.New(c.Clientset)
	keepsSlices := kubeletAtLeast(t, c, 1, 33)

	before := waitSlice(t, c, 8)
	ns := c.Namespace(t, "restart")
	c.Kubectl(t, "-n", ns, "apply", "-f", filepath.Join("testdata", "seed", seedTemplate(version)))
	holder := runTemplatePod(t, c, ns, "holder")
	holderEnv := c.GPUEnv(t, ns, "holder")
	holderClaim := podClaim(t, c, claims, holder)
	if state := readNodeState(t); !slices.Equal(state.specs[holderClaim.uid].devices(), holderClaim.devices) {
		t.Fatalf("CDI spec of the holder's claim has %v, allocated %v", state.specs[holderClaim.uid].devices(), holderClaim.devices)
	}

	old := servingPlugin(t, c, time.Minute, nil)
	watch := watchSlice(t, c, before)
	start := time.Now()
	c.Kubectl(t, "-n", releaseNS, "delete", "pod", old.Name, "--wait=false")
	servingPlugin(t, c, 2*time.Minute, func(p *corev1.Pod) bool { return p.UID != old.UID })
	framework.Eventually(t, time.Minute, "the old plugin pod to be gone", func() (bool, error) {
		_, err := c.Clientset.CoreV1().Pods(releaseNS).Get(ctx, old.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	recovery := time.Since(start)
	seen := watch()
	after := waitSlice(t, c, 8)
	switch {
	case keepsSlices && (seen.absent > 0 || seen.replaced > 0 || after.uid != before.uid):
		t.Errorf("while the plugin restarted, its slice was absent in %d of %d looks and replaced %d times (%s -> %s); want it untouched",
			seen.absent, seen.looks, seen.replaced, before.uid, after.uid)
	case !keepsSlices:
		t.Logf("kubelet 1.32 deletes a driver's slices when its plugin unregisters: absent in %d of %d looks, back as %s", seen.absent, seen.looks, after.uid)
	}
	if !slices.Equal(after.devices, before.devices) {
		t.Errorf("devices after the restart %v, before %v", after.devices, before.devices)
	}

	if pod := c.WaitForPodPhase(t, ns, "holder", time.Second, corev1.PodRunning); pod.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the holder's container restarted %d times", pod.Status.ContainerStatuses[0].RestartCount)
	}
	if env := c.GPUEnv(t, ns, "holder"); !slices.Equal(env, holderEnv) {
		t.Errorf("the holder sees %q after the restart, %q before", env, holderEnv)
	}
	state := readNodeState(t)
	if _, ok := state.specs[holderClaim.uid]; !ok {
		t.Errorf("the holder's CDI spec is gone after the restart")
	}
	if _, ok := state.entries[holderClaim.uid]; !ok {
		t.Errorf("the holder's claim is not in the new plugin's checkpoint")
	}

	second := runTemplatePod(t, c, ns, "second")
	secondClaim := podClaim(t, c, claims, second)
	for _, d := range secondClaim.devices {
		if slices.Contains(holderClaim.devices, d) {
			t.Errorf("the new pod got %s, which the holder has", d)
		}
	}
	if env := c.GPUEnv(t, ns, "second"); len(env) != 1 || slices.Equal(env, holderEnv) {
		t.Errorf("the new pod sees %q, the holder %q", env, holderEnv)
	}
	if doubles := readNodeState(t).doublePrepared(); len(doubles) > 0 {
		t.Errorf("prepared for two claims at once: %v", doubles)
	}

	// The new plugin unprepares what the old one prepared.
	c.Kubectl(t, "-n", ns, "delete", "pod", "holder", "second", "--wait=true")
	framework.Eventually(t, time.Minute, "the claims' CDI specs and checkpoint entries to be removed", func() (bool, error) {
		s := readNodeState(t)
		return len(s.specs) == 0 && len(s.entries) == 0, nil
	})

	// Gone for good: the node leaves the DaemonSet's nodeSelector. The plugin leaves its slice
	// (as on every SIGTERM); the kubelet deletes it once no plugin is registered.
	unselected := time.Now()
	rel.upgrade(t, "--set-string", "kubeletPlugin.nodeSelector.gpu-dra-e2e/unselected=true")
	framework.Eventually(t, time.Minute, "the plugin pod to leave the unselected node", func() (bool, error) {
		pods, err := c.Clientset.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{LabelSelector: pluginSelector})
		return err == nil && len(pods.Items) == 0, err
	})
	framework.Eventually(t, 90*time.Second, "the kubelet to delete the slice of a node without plugin", func() (bool, error) {
		s, err := listSlices(c)
		return err == nil && len(s) == 0, err
	})
	wiped := time.Since(unselected)
	rel.upgrade(t)
	waitSlice(t, c, 8)
	servingPlugin(t, c, time.Minute, nil)

	start = time.Now()
	rel.uninstall(t)
	uninstalled := time.Now()
	// Well before the kubelet's 30 s: the pre-delete hook, not the kubelet, removed them.
	framework.Eventually(t, 10*time.Second, "no ResourceSlice of "+driver+" after helm uninstall", func() (bool, error) {
		s, err := listSlices(c)
		return err == nil && len(s) == 0, err
	})
	t.Logf("RESTART plugin: new plugin serving %.1fs after its pod was deleted; slice kept: %v (absent in %d of %d looks, replaced %d times); "+
		"node unselected: slice deleted by the kubelet after %.0fs; helm uninstall took %.1fs, the last slice gone %.1fs after it returned",
		recovery.Seconds(), seen.absent == 0 && seen.replaced == 0, seen.absent, seen.looks, seen.replaced,
		wiped.Seconds(), uninstalled.Sub(start).Seconds(), time.Since(uninstalled).Seconds())
}

// chartRelease is the chart installed for one test; it is uninstalled when the test ends, unless the test
// did so itself.
type chartRelease struct {
	c         *framework.Cluster
	probe     string
	args      []string
	installed bool
}

// installRelease installs the chart with extraArgs, which every upgrade keeps.
func installRelease(t *testing.T, c *framework.Cluster, version string, extraArgs ...string) *chartRelease {
	t.Helper()
	r := &chartRelease{c: c, probe: filepath.Join("testdata", "seed", seedTemplate(version)), args: extraArgs, installed: true}
	t.Cleanup(func() {
		if !r.installed {
			return
		}
		if t.Failed() {
			logs, _ := c.KubectlErr("-n", releaseNS, "logs", "-l", pluginSelector, "--tail=80", "--all-containers", "--prefix")
			t.Logf("plugin logs:\n%s", logs)
		}
		r.uninstall(t)
	})
	r.upgrade(t)
	return r
}

// upgrade installs or upgrades the release with the chart's defaults, the install's arguments
// and extraArgs.
func (r *chartRelease) upgrade(t *testing.T, extraArgs ...string) {
	t.Helper()
	r.c.InstallChart(t, filepath.Join("..", "charts", "gpu-dra"), r.probe, append(slices.Clone(r.args), extraArgs...)...)
}

func (r *chartRelease) uninstall(t *testing.T) {
	t.Helper()
	r.installed = false
	r.c.Helm(t, "uninstall", release, "-n", releaseNS, "--wait", "--timeout", "3m")
}

func kubeletAtLeast(t *testing.T, c *framework.Cluster, major, minor uint) bool {
	t.Helper()
	nodes, err := c.Clientset.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 {
		t.Fatalf("want the local cluster's one node: %v", err)
	}
	v, err := version.ParseGeneric(nodes.Items[0].Status.NodeInfo.KubeletVersion)
	if err != nil {
		t.Fatal(err)
	}
	return v.AtLeast(version.MajorMinor(major, minor))
}

// sliceInfo is the node's one ResourceSlice of the driver.
type sliceInfo struct {
	uid     types.UID
	devices []string
}

func listSlices(c *framework.Cluster) ([]sliceInfo, error) {
	list, err := draclient.New(c.Clientset).ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.driver=" + driver})
	if err != nil {
		return nil, err
	}
	var out []sliceInfo
	for _, s := range list.Items {
		info := sliceInfo{uid: s.UID}
		for _, d := range s.Spec.Devices {
			info.devices = append(info.devices, d.Name)
		}
		slices.Sort(info.devices)
		out = append(out, info)
	}
	return out, nil
}

// waitSlice waits for the node's slice with n devices.
func waitSlice(t *testing.T, c *framework.Cluster, n int) sliceInfo {
	t.Helper()
	var s []sliceInfo
	framework.Eventually(t, 2*time.Minute, fmt.Sprintf("one ResourceSlice with %d devices", n), func() (bool, error) {
		var err error
		s, err = listSlices(c)
		return err == nil && len(s) == 1 && len(s[0].devices) == n, err
	})
	return s[0]
}

// sliceLooks counts what watchSlice saw.
type sliceLooks struct {
	looks, absent, replaced int
}

// watchSlice looks at the node's slices every 100ms until the returned function is called: how
// often none was there, and how often another one than want (a deleted and recreated slice).
func watchSlice(t *testing.T, c *framework.Cluster, want sliceInfo) func() sliceLooks {
	t.Helper()
	var mu sync.Mutex
	var seen sliceLooks
	last := want.uid
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			s, err := listSlices(c)
			mu.Lock()
			if err == nil {
				seen.looks++
				switch {
				case len(s) == 0:
					seen.absent++
				case s[0].uid != last:
					seen.replaced++
					last = s[0].uid
				}
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return func() sliceLooks {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// servingPlugin waits for a plugin pod that accept takes (nil: any) to serve: Running, not being
// deleted, and its /healthz answering, which exercises its registration and DRA sockets.
func servingPlugin(t *testing.T, c *framework.Cluster, timeout time.Duration, accept func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var found *corev1.Pod
	framework.Eventually(t, timeout, "a serving plugin pod", func() (bool, error) {
		var err error
		found, err = findServingPlugin(c, accept)
		return found != nil, err
	})
	return found
}

var healthClient = &http.Client{Timeout: time.Second}

func findServingPlugin(c *framework.Cluster, accept func(*corev1.Pod) bool) (*corev1.Pod, error) {
	pods, err := c.Clientset.CoreV1().Pods(releaseNS).List(context.Background(), metav1.ListOptions{LabelSelector: pluginSelector})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" || (accept != nil && !accept(p)) {
			continue
		}
		resp, err := healthClient.Get("http://" + p.Status.PodIP + ":8081/healthz")
		if err != nil {
			return nil, err
		}
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return p, nil
		}
		return nil, fmt.Errorf("plugin pod %s: /healthz %s", p.Name, resp.Status)
	}
	return nil, nil
}

// runTemplatePod creates a pod with a claim from the seed's template and waits for it to run.
func runTemplatePod(t *testing.T, c *framework.Cluster, ns, name string) *corev1.Pod {
	t.Helper()
	if out, err := c.KubectlStdin([]byte(framework.TemplatePod(name, "example")), "-n", ns, "apply", "-f", "-"); err != nil {
		t.Fatalf("create pod %s: %v\n%s", name, err, out)
	}
	return c.WaitForPodPhase(t, ns, name, 2*time.Minute, corev1.PodRunning)
}

// allocatedClaim is a pod's claim and the devices the scheduler allocated to it.
type allocatedClaim struct {
	uid     types.UID
	devices []string
}

func podClaim(t *testing.T, c *framework.Cluster, claims *draclient.Client, pod *corev1.Pod) allocatedClaim {
	t.Helper()
	got, err := claimOf(claims, pod)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func claimOf(claims *draclient.Client, pod *corev1.Pod) (allocatedClaim, error) {
	if len(pod.Status.ResourceClaimStatuses) != 1 || pod.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		return allocatedClaim{}, fmt.Errorf("pod %s: claim statuses %v, want one generated claim", pod.Name, pod.Status.ResourceClaimStatuses)
	}
	name := *pod.Status.ResourceClaimStatuses[0].ResourceClaimName
	claim, err := claims.ResourceClaims(pod.Namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return allocatedClaim{}, err
	}
	if claim.Status.Allocation == nil {
		return allocatedClaim{}, fmt.Errorf("claim %s/%s of running pod %s is not allocated", pod.Namespace, name, pod.Name)
	}
	got := allocatedClaim{uid: claim.UID}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == driver {
			got.devices = append(got.devices, r.Pool+"/"+r.Device)
		}
	}
	slices.Sort(got.devices)
	return got, nil
}

// nodeState is what the plugin keeps on the node: the CDI spec of each prepared claim and its
// checkpoint, read without touching them.
type nodeState struct {
	specs, entries map[types.UID]preparedClaim
}

type preparedClaim checkpoint.PreparedClaim

// devices are pool/device, sorted, as allocatedClaim has them.
func (p preparedClaim) devices() []string {
	var out []string
	for _, d := range p.Devices {
		out = append(out, d.Pool+"/"+d.Device)
	}
	slices.Sort(out)
	return out
}

func readNodeState(t *testing.T) nodeState {
	t.Helper()
	s, err := nodeStateNow()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func nodeStateNow() (nodeState, error) {
	s := nodeState{specs: map[types.UID]preparedClaim{}, entries: map[types.UID]preparedClaim{}}
	w, err := cdi.NewWriter(cdiDir, driver)
	if err != nil {
		return s, err
	}
	uids, err := w.List()
	if err != nil {
		return s, err
	}
	for _, uid := range uids {
		c, err := w.Read(uid)
		if err != nil {
			// Removed between List and Read: an unprepare.
			if !w.Exists(uid) {
				continue
			}
			return s, err
		}
		s.specs[uid] = preparedClaim(c)
	}
	data, err := checkpoint.Read(filepath.Join(pluginDataDir, checkpoint.FileName))
	if err != nil {
		return s, err
	}
	for uid, c := range data.Claims {
		s.entries[uid] = preparedClaim(c)
	}
	return s, nil
}

// doublePrepared lists devices that two claims hold exclusively at once, in the CDI specs or in
// the checkpoint.
func (s nodeState) doublePrepared() []string {
	var out []string
	for what, claims := range map[string]map[types.UID]preparedClaim{"CDI specs": s.specs, "checkpoint": s.entries} {
		holder := map[string]types.UID{}
		for uid, c := range claims {
			for _, d := range c.Devices {
				if d.AdminAccess {
					continue
				}
				key := d.Pool + "/" + d.Device
				if other, ok := holder[key]; ok {
					out = append(out, fmt.Sprintf("%s: %s in claims %s and %s", what, key, other, uid))
				}
				holder[key] = uid
			}
		}
	}
	slices.Sort(out)
	return out
}
