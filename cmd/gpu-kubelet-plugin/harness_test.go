package main_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/gpu-dra/gpu-dra/driver/cdi"
	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

const (
	driverName = "gpu.example.com"
	namespace  = "default"
	// v1Only serves resource.k8s.io/v1 and nothing older, like a 1.36+ cluster.
	v1Only = "resource.k8s.io/v1=true,resource.k8s.io/v1beta2=false,resource.k8s.io/v1beta1=false"
)

// binary is built once in TestMain, in binDir.
var binary, binDir string

// buildBinary builds pkg as `make build` builds what the image ships, so RSS and timings are of
// that binary.
func buildBinary(pkg, out string) error {
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("go build %s: %w", pkg, err)
	}
	return nil
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gkp-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	binary = filepath.Join(dir, "gpu-kubelet-plugin")
	if err := buildBinary(".", binary); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// cluster is a real API server with one Node and the directories a kubelet would provide.
type cluster struct {
	srv        *testapiserver.Server
	kubeconfig string
	node       string
	claims     *draclient.Client
	// registrar, plugins and cdiRoot are shared by all plugin instances of the test, like the
	// host paths of a DaemonSet.
	registrar, plugins, cdiRoot string
}

func newCluster(t testing.TB, runtimeConfig string, nodeLabels map[string]string, opts ...testapiserver.Option) *cluster {
	t.Helper()
	srv := testapiserver.Start(t, append([]testapiserver.Option{testapiserver.WithRuntimeConfig(runtimeConfig)}, opts...)...)
	// Unix socket paths are limited to 108 bytes; t.TempDir() can be longer.
	base, err := os.MkdirTemp("", "gkp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	c := &cluster{
		srv: srv, node: "node-1", claims: draclient.New(srv.Clientset),
		kubeconfig: filepath.Join(base, "kubeconfig"),
		registrar:  filepath.Join(base, "reg"), plugins: filepath.Join(base, "plugins"), cdiRoot: filepath.Join(base, "cdi"),
	}
	for _, d := range []string{c.registrar, c.plugins, c.cdiRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(c.kubeconfig, srv.Env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = srv.Clientset.CoreV1().Nodes().Create(context.Background(), &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: c.node, Labels: nodeLabels},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// nodeGroups writes a node-groups file giving every node count GPUs and returns the flag for it.
func (c *cluster) nodeGroups(t testing.TB, count int) string {
	t.Helper()
	path := filepath.Join(filepath.Dir(c.kubeconfig), "inventory.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf("defaults: {count: %d}\n", count)), 0o600); err != nil {
		t.Fatal(err)
	}
	return "--node-groups=" + path
}

func (c *cluster) dataDir() string { return filepath.Join(c.plugins, driverName) }

// plugin is one running plugin process.
type plugin struct {
	t                      testing.TB
	c                      *cluster
	cmd                    *exec.Cmd
	podUID                 string
	healthAddr, metricAddr string
	log                    string
	exited                 chan error
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}

func (c *cluster) startPlugin(t testing.TB, podUID string, extraArgs ...string) *plugin {
	t.Helper()
	return c.startBinary(t, binary, podUID, extraArgs...)
}

// startBinary starts bin with the plugin's flags: gpu-kubelet-plugin, or the benchmark's floor.
func (c *cluster) startBinary(t testing.TB, bin, podUID string, extraArgs ...string) *plugin {
	t.Helper()
	p := &plugin{t: t, c: c, podUID: podUID, healthAddr: freeAddr(t), metricAddr: freeAddr(t), exited: make(chan error, 1)}
	logFile, err := os.CreateTemp(filepath.Dir(c.kubeconfig), "plugin-*.log")
	if err != nil {
		t.Fatal(err)
	}
	p.log = logFile.Name()
	args := append([]string{
		"--driver-name=" + driverName,
		"--kubeconfig=" + c.kubeconfig,
		"--kubelet-registrar-dir=" + c.registrar,
		"--kubelet-plugins-dir=" + c.plugins,
		"--cdi-root=" + c.cdiRoot,
		"--health-probe-bind-address=" + p.healthAddr,
		"--metrics-bind-address=" + p.metricAddr,
		"-v=3",
	}, extraArgs...)
	p.cmd = exec.Command(bin, args...)
	// Like the DaemonSet: node name and pod UID from the downward API.
	p.cmd.Env = append(os.Environ(), "NODE_NAME="+c.node, "POD_UID="+podUID)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait(); _ = logFile.Close() }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			logs, _ := os.ReadFile(p.log)
			t.Logf("plugin %q log:\n%s", podUID, tail(string(logs), 60))
		}
	})
	return p
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

func (p *plugin) registrationSocket() string {
	if p.podUID == "" {
		return filepath.Join(p.c.registrar, driverName+"-reg.sock")
	}
	return filepath.Join(p.c.registrar, kubeletplugin.RollingUpdateRegistrarSocketFile(p.c.registrar, driverName, types.UID(p.podUID)))
}

// kill sends SIGKILL: no cleanup runs, like a node crash or OOM kill.
func (p *plugin) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
	}
}

// killDuring runs calls (a kubelet's sequence of calls, each reporting progress when it
// completed) in the background and SIGKILLs the plugin once completed of them are done and delay
// has passed, somewhere inside the next ones; it returns when calls has stopped.
func (p *plugin) killDuring(completed int, delay time.Duration, calls func(progress func())) {
	done := make(chan struct{})
	progress := make(chan struct{}, 1024)
	go func() {
		defer close(done)
		calls(func() { progress <- struct{}{} })
	}()
	for i := 0; i < completed; i++ {
		select {
		case <-progress:
		case <-done:
		}
	}
	time.Sleep(delay)
	p.kill()
	<-done
}

// terminate sends SIGTERM and waits for a clean exit.
func (p *plugin) terminate() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		if err != nil {
			p.t.Fatalf("plugin exited with %v after SIGTERM", err)
		}
	case <-time.After(30 * time.Second):
		p.t.Fatal("plugin did not exit within 30s of SIGTERM")
	}
}

// kubelet plays the kubelet's part: GetInfo and NotifyRegistrationStatus on the registration
// socket, then the DRA service on the advertised endpoint, in the gRPC version it prefers.
type kubelet struct {
	info *registerapi.PluginInfo
	conn *grpc.ClientConn
	// dra speaks the v1 messages; for a 1.32/1.33 kubelet it is the kubelet API's own wrapper that
	// sends them over the v1beta1 service.
	dra drapbv1.DRAPluginClient
}

func (p *plugin) register(ctx context.Context, useV1beta1 bool) *kubelet {
	p.t.Helper()
	sock := p.registrationSocket()
	var info *registerapi.PluginInfo
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-p.exited:
			return false, fmt.Errorf("plugin exited before registering: %v", err)
		default:
		}
		if _, err := os.Stat(sock); err != nil {
			return false, nil
		}
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return false, err
		}
		defer func() { _ = conn.Close() }()
		client := registerapi.NewRegistrationClient(conn)
		info, err = client.GetInfo(ctx, &registerapi.InfoRequest{})
		if err != nil {
			return false, nil
		}
		_, err = client.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true})
		return err == nil, err
	})
	if err != nil {
		p.t.Fatalf("register via %s: %v", sock, err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != driverName {
		p.t.Fatalf("GetInfo = %+v", info)
	}
	for _, svc := range []string{drapbv1.DRAPluginService, drapbv1beta1.DRAPluginService} {
		if !slices.Contains(info.SupportedVersions, svc) {
			p.t.Errorf("plugin does not advertise %s: %v", svc, info.SupportedVersions)
		}
	}
	conn, err := grpc.NewClient("unix://"+info.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { _ = conn.Close() })
	k := &kubelet{info: info, conn: conn, dra: drapbv1.NewDRAPluginClient(conn)}
	if useV1beta1 {
		k.dra = drapbv1beta1.V1Beta1ClientWrapper{DRAPluginClient: drapbv1beta1.NewDRAPluginClient(conn)}
	}
	return k
}

// prepared is the kubelet's view of one prepared claim: CDI IDs by device.
type prepared map[string][]string

func (k *kubelet) prepare(ctx context.Context, claims ...*resourceapi.ResourceClaim) (map[types.UID]prepared, error) {
	resp, err := k.dra.NodePrepareResources(ctx, &drapbv1.NodePrepareResourcesRequest{Claims: claimRefs(claims)})
	if err != nil {
		return nil, err
	}
	out := map[types.UID]prepared{}
	for uid, r := range resp.Claims {
		if r.Error != "" {
			return nil, fmt.Errorf("claim %s: %s", uid, r.Error)
		}
		p := prepared{}
		for _, d := range r.Devices {
			p[d.PoolName+"/"+d.DeviceName] = d.CdiDeviceIds
		}
		out[types.UID(uid)] = p
	}
	return out, nil
}

func (k *kubelet) unprepare(ctx context.Context, claims ...*resourceapi.ResourceClaim) error {
	resp, err := k.dra.NodeUnprepareResources(ctx, &drapbv1.NodeUnprepareResourcesRequest{Claims: claimRefs(claims)})
	if err != nil {
		return err
	}
	var errs []error
	for uid, r := range resp.Claims {
		if r.Error != "" {
			errs = append(errs, fmt.Errorf("claim %s: %s", uid, r.Error))
		}
	}
	return errors.Join(errs...)
}

func claimRefs(claims []*resourceapi.ResourceClaim) []*drapbv1.Claim {
	refs := make([]*drapbv1.Claim, 0, len(claims))
	for _, c := range claims {
		refs = append(refs, &drapbv1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	return refs
}

// allocatedClaim creates a ResourceClaim and writes an allocation naming devices of this node's
// pool into its status, as the scheduler would. configs are opaque GpuConfig JSON documents applied
// as claim configs (class configs are given with a "class:" prefix).
func (c *cluster) allocatedClaim(t testing.TB, ctx context.Context, name string, devices []string, configs ...string) *resourceapi.ResourceClaim {
	t.Helper()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: driverName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(len(devices)),
			},
		}}}},
	}
	created, err := c.claims.ResourceClaims(namespace).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create claim %s: %v", name, err)
	}
	alloc := &resourceapi.AllocationResult{}
	for _, d := range devices {
		alloc.Devices.Results = append(alloc.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "gpu", Driver: driverName, Pool: c.node, Device: d,
		})
	}
	for _, cfg := range configs {
		source := resourceapi.AllocationConfigSourceClaim
		if rest, ok := strings.CutPrefix(cfg, "class:"); ok {
			source, cfg = resourceapi.AllocationConfigSourceClass, rest
		}
		alloc.Devices.Config = append(alloc.Devices.Config, resourceapi.DeviceAllocationConfiguration{
			Source: source,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: driverName, Parameters: runtime.RawExtension{Raw: []byte(cfg)},
			}},
		})
	}
	created.Status.Allocation = alloc
	updated, err := c.claims.ResourceClaims(namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("allocate claim %s: %v", name, err)
	}
	return updated
}

// slices lists this node's ResourceSlices of the driver in the given API version, directly (not
// through the converting client), so the test sees what that version really serves.
func (c *cluster) slices(ctx context.Context, version string) ([]resourceapi.Device, int, error) {
	opts := metav1.ListOptions{FieldSelector: "spec.driver=" + driverName + ",spec.nodeName=" + c.node}
	switch version {
	case "v1beta1":
		list, err := c.srv.Clientset.ResourceV1beta1().ResourceSlices().List(ctx, opts)
		if err != nil {
			return nil, 0, err
		}
		var devices []resourceapi.Device
		for _, s := range list.Items {
			if s.Spec.Pool.Name != c.node {
				return nil, 0, fmt.Errorf("slice %s in pool %q", s.Name, s.Spec.Pool.Name)
			}
			for _, d := range s.Spec.Devices {
				if d.Basic == nil {
					return nil, 0, fmt.Errorf("v1beta1 device %s without basic", d.Name)
				}
				dev := resourceapi.Device{Name: d.Name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}, Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}}
				for k, v := range d.Basic.Attributes {
					dev.Attributes[resourceapi.QualifiedName(k)] = resourceapi.DeviceAttribute{IntValue: v.IntValue, StringValue: v.StringValue, VersionValue: v.VersionValue, BoolValue: v.BoolValue}
				}
				for k, v := range d.Basic.Capacity {
					dev.Capacity[resourceapi.QualifiedName(k)] = resourceapi.DeviceCapacity{Value: v.Value}
				}
				devices = append(devices, dev)
			}
		}
		return devices, len(list.Items), nil
	default:
		list, err := c.srv.Clientset.ResourceV1().ResourceSlices().List(ctx, opts)
		if err != nil {
			return nil, 0, err
		}
		var devices []resourceapi.Device
		for _, s := range list.Items {
			if s.Spec.Pool.Name != c.node {
				return nil, 0, fmt.Errorf("slice %s in pool %q", s.Name, s.Spec.Pool.Name)
			}
			devices = append(devices, s.Spec.Devices...)
		}
		return devices, len(list.Items), nil
	}
}

// sliceVersions identifies each ResourceSlice of the driver and its content, in the given API
// version: name/UID/resourceVersion, sorted. Equal lists mean nobody deleted or rewrote a slice.
func (c *cluster) sliceVersions(t testing.TB, ctx context.Context, version string) []string {
	t.Helper()
	opts := metav1.ListOptions{FieldSelector: "spec.driver=" + driverName}
	var metas []metav1.ObjectMeta
	switch version {
	case "v1beta1":
		list, err := c.srv.Clientset.ResourceV1beta1().ResourceSlices().List(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list.Items {
			metas = append(metas, s.ObjectMeta)
		}
	default:
		list, err := c.srv.Clientset.ResourceV1().ResourceSlices().List(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list.Items {
			metas = append(metas, s.ObjectMeta)
		}
	}
	out := make([]string, 0, len(metas))
	for _, m := range metas {
		out = append(out, m.Name+"/"+string(m.UID)+"/"+m.ResourceVersion)
	}
	slices.Sort(out)
	return out
}

// consistent checks the crash-safety invariant: the CDI specs on disk are exactly the checkpoint's
// entries. It returns the entries.
func (c *cluster) consistent(t testing.TB) map[types.UID]checkpoint.PreparedClaim {
	t.Helper()
	data, err := checkpoint.NewStore(c.dataDir()).Load()
	if err != nil {
		t.Fatalf("checkpoint after restart: %v", err)
	}
	w, err := cdi.NewWriter(c.cdiRoot, driverName)
	if err != nil {
		t.Fatal(err)
	}
	specs, err := w.List()
	if err != nil {
		t.Fatal(err)
	}
	var entries []types.UID
	for uid := range data.Claims {
		entries = append(entries, uid)
	}
	slices.Sort(entries)
	if !slices.Equal(specs, entries) {
		t.Fatalf("CDI specs %v != checkpoint entries %v", specs, entries)
	}
	return data.Claims
}

func (p *plugin) get(path string, addr string) (int, string, error) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), nil
}
