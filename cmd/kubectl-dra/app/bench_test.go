package app

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

const (
	benchNodes   = 1000
	benchGPUs    = 8
	benchWorkers = 16
)

// BenchmarkFleet1000Nodes runs status and why, as `kubectl dra` runs them, against a real
// kube-apiserver holding 1,000 nodes (with a realistic status) and their ResourceSlices of 8 GPUs,
// with 1 to 7 GPUs of every node held by single-GPU claims (3,997 claims, each reserved for a pod),
// so that a pod asking for 8 GPUs finds none. Setting it up takes about a minute; each operation
// is one command from kubeconfig to printed answer.
//
//	go test -run '^$' -bench BenchmarkFleet1000Nodes -benchtime 5x ./cmd/kubectl-dra/app
func BenchmarkFleet1000Nodes(b *testing.B) {
	srv := testapiserver.Start(b)
	populate(b, srv, benchNodes, func(i int) int { return 1 + i%7 })
	runBenchCases(b, srv, []benchCase{
		{"status", []string{"status"}, "LATEST-GPU-MODEL   8000      4003   3997"},
		{"status-one-node", []string{"status", "--node", "n0500"}, "n0500"},
		{"why-nine", []string{"why", "resourceclaim/nine"}, "TooFewDevices: 9 wanted, best node n0000 has 8 matching"},
		{"why-eight-held", []string{"why", "resourceclaim/eight"}, "DevicesAllocated: 3997 matching devices on the 1000 nodes"},
		{"why-two-fit", []string{"why", "resourceclaim/two"}, "Allocatable: the allocator finds devices for the claim now"},
		{"why-constraint", []string{"why", "resourceclaim/pair"}, "ConstraintUnsatisfiable"},
	})
}

// benchCase is one command of a benchmark and a regular expression its output matches.
type benchCase struct {
	name string
	args []string
	want string
}

// runBenchCases runs each case as a sub-benchmark against srv through a kubeconfig.
func runBenchCases(b *testing.B, srv *testapiserver.Server, cases []benchCase) {
	kubeconfig := writeKubeconfig(b, srv.Config)
	b.Setenv("KUBECONFIG", "")
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) { runBenchCase(b, bc, append(bc.args, "--kubeconfig", kubeconfig)) })
	}
}

// runBenchCase runs the command of bc with args in a loop and reports the CPU time it took, and
// that of the server processes the test started.
func runBenchCase(b *testing.B, bc benchCase, args []string) {
	want := regexp.MustCompile(bc.want)
	client, server := cpuSeconds(b)
	for b.Loop() {
		r := run(b, "", args...)
		if r.code != 0 || !want.MatchString(r.stdout) {
			b.Fatalf("exit %d, stdout lacks %q:\n%.3000s\nstderr:\n%s", r.code, bc.want, r.stdout, r.stderr)
		}
	}
	client2, server2 := cpuSeconds(b)
	b.ReportMetric((client2-client)/float64(b.N), "client-cpu-s/op")
	b.ReportMetric((server2-server)/float64(b.N), "server-cpu-s/op")
}

// BenchmarkFleetLarge runs status and why against a real kube-apiserver holding
// GPU_DRA_BENCH_NODES nodes (5,000 unless set) with their slices of 8 GPUs, every GPU held by a
// claim written with its allocation (40,000 claims at 5,000 nodes). Seeding goes at benchWorkers
// requests in flight and its time is logged: at 5,000 nodes it takes minutes.
//
//	go test -run '^$' -bench BenchmarkFleetLarge -benchtime 3x -timeout 60m ./cmd/kubectl-dra/app
func BenchmarkFleetLarge(b *testing.B) {
	nodes := largeFleetNodes(b)
	srv := testapiserver.Start(b)
	start := time.Now()
	populate(b, srv, nodes, func(int) int { return benchGPUs })
	b.Logf("seeded %d nodes, %d slices of %d GPUs and %d allocated claims in %s", nodes, nodes, benchGPUs, nodes*benchGPUs, time.Since(start).Round(time.Second))
	runBenchCases(b, srv, []benchCase{
		{"status", []string{"status"}, fmt.Sprintf(`(?m)^LATEST-GPU-MODEL +%d +0 +%d`, nodes*benchGPUs, nodes*benchGPUs)},
		{"status-one-node", []string{"status", "--node", "n0001"}, "n0001"},
		{"why-eight-held", []string{"why", "resourceclaim/eight"}, fmt.Sprintf("DevicesAllocated: %d matching devices on the %d nodes", nodes*benchGPUs, nodes)},
		{"why-allocated", []string{"why", "resourceclaim/job-n0001-0"}, "n0001"},
	})
}

// largeFleetNodes is GPU_DRA_BENCH_NODES, 5,000 unless set.
func largeFleetNodes(b *testing.B) int {
	v := os.Getenv("GPU_DRA_BENCH_NODES")
	if v == "" {
		return 5000
	}
	nodes, err := strconv.Atoi(v)
	if err != nil || nodes < 2 {
		b.Fatalf("GPU_DRA_BENCH_NODES=%q: want a number of nodes, at least 2", v)
	}
	return nodes
}

// populate creates the benchmark's cluster of nodes, node i with claims(i) of its GPUs held, with
// benchWorkers requests in flight.
func populate(b *testing.B, srv *testapiserver.Server, nodes int, claims func(i int) int) {
	b.Helper()
	ctx := context.Background()
	cs := srv.Clientset
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: deviceschema.DefaultDriverName},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}}}}
	if _, err := cs.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(benchWorkers)
	for i := range nodes {
		g.Go(func() error { return createBenchNode(ctx, srv, i, claims(i)) })
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	exact := func(count int64) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class.Name, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}
	}
	pending := map[string]resourceapi.DeviceClaim{
		"nine":  {Requests: []resourceapi.DeviceRequest{exact(9)}},
		"eight": {Requests: []resourceapi.DeviceRequest{exact(8)}},
		"two":   {Requests: []resourceapi.DeviceRequest{exact(2)}},
		"pair": {Requests: []resourceapi.DeviceRequest{{Name: "a", Exactly: exact(1).Exactly}, {Name: "b", Exactly: exact(1).Exactly}},
			Constraints: []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("gpu.example.com/uuid"))}}},
	}
	for name, devices := range pending {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: resourceapi.ResourceClaimSpec{Devices: devices}}
		if _, err := cs.ResourceV1().ResourceClaims("default").Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// createBenchNode creates node i with a kubelet's kind of status, its slice and the claims holding
// held of its GPUs.
func createBenchNode(ctx context.Context, srv *testapiserver.Server, i, held int) error {
	cs := srv.Clientset
	name := fmt.Sprintf("n%04d", i)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "gpu.example.com/group": "latest", "topology.kubernetes.io/zone": fmt.Sprintf("zone-%d", i%3)}}}
	created, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	created.Status = corev1.NodeStatus{
		Capacity:  corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi"), corev1.ResourcePods: resource.MustParse("110")},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.0.%d.%d", i/250, i%250)}, {Type: corev1.NodeHostName, Address: name}},
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.34.2", ContainerRuntimeVersion: "containerd://2.2.0", OSImage: "Debian GNU/Linux 12", Architecture: "amd64", OperatingSystem: "linux"},
	}
	for k := range 20 {
		created.Status.Images = append(created.Status.Images, corev1.ContainerImage{
			Names: []string{fmt.Sprintf("registry.example.com/team/image-%d@sha256:%064d", k, k), fmt.Sprintf("registry.example.com/team/image-%d:v1.%d", k, k)}, SizeBytes: int64(100_000_000 + k)})
	}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return err
	}
	slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-gpu.example.com"},
		Spec: resourceapi.ResourceSliceSpec{Driver: deviceschema.DefaultDriverName, NodeName: ptr.To(name), Pool: resourceapi.ResourcePool{Name: name, ResourceSliceCount: 1}}}
	for d := range benchGPUs {
		slice.Spec.Devices = append(slice.Spec.Devices, resourceapi.Device{Name: deviceschema.DeviceName(d),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				deviceschema.AttrIndex:         {IntValue: ptr.To(int64(d))},
				deviceschema.AttrUUID:          {StringValue: ptr.To(fmt.Sprintf("gpu-%s-%d", name, d))},
				deviceschema.AttrModel:         {StringValue: ptr.To(deviceschema.DefaultModel)},
				deviceschema.AttrDriverVersion: {VersionValue: ptr.To(deviceschema.DefaultDriverVersion)},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{deviceschema.CapMemory: {Value: deviceschema.DefaultMemory}}})
	}
	if _, err := cs.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return err
	}
	for d := range held {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("job-%s-%d", name, d), Namespace: "default"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: deviceschema.DefaultDriverName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}}}}
		created, err := cs.ResourceV1().ResourceClaims("default").Create(ctx, c, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		created.Status.Allocation = &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: deviceschema.DefaultDriverName, Pool: name, Device: deviceschema.DeviceName(d)}}},
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{name}}}}}},
		}
		created.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: c.Name, UID: types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", i*8+d))}}
		if _, err := cs.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// cpuSeconds is the CPU time this process (the command's client side) and its children (the API
// server and etcd envtest started) have used: on a machine shared with other work, wall time
// says more about the neighbours than about the command.
func cpuSeconds(b *testing.B) (client, server float64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return client, 0
	}
	self := strconv.Itoa(os.Getpid())
	for _, p := range procs {
		data, err := os.ReadFile("/proc/" + p.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime stime: fields 14 and 15, counted after the comm.
		_, rest, ok := strings.Cut(string(data), ") ")
		fields := strings.Fields(rest)
		if !ok || len(fields) < 13 || fields[1] != self {
			continue
		}
		for _, f := range fields[11:13] {
			ticks, _ := strconv.ParseFloat(f, 64)
			server += ticks / 100 // USER_HZ
		}
	}
	return client, server
}
