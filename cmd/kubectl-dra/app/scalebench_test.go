package app

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/driver/plugin"
	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// The scale harness's claims phase (e2e/scale): its node groups, namespaces and names.
const (
	scaleNodeGroups  = "../../../e2e/scale/testdata/node-groups.yaml"
	scaleGroupLabel  = "scale.gpu-dra.io/group"
	scaleNamespace   = "scale-load"
	scaleWhy         = "scale-why"
	scaleNamespaces  = 20
	scaleClassSelect = `device.driver == "gpu.example.com"`
)

// BenchmarkScaleFleet runs status and `why pod/scale-why` against the fleet of `make scale`'s
// claims phase held in memory by a protoServer: GPU_DRA_BENCH_NODES nodes (5,000 unless set) of
// the harness's three node groups, 8 GPUs each, every GPU held by a claim of its own (40,000 at
// 5,000 nodes), and a pod whose claim wants 8 GPUs. The server answers from encoded responses,
// so the time and a CPU profile are the command's own: requests, decoding, analysis, printing.
// The first run of each command, before the timed ones, encodes the responses.
//
//	go test -run '^$' -bench BenchmarkScaleFleet -benchtime 10x -cpuprofile cpu.out ./cmd/kubectl-dra/app
func BenchmarkScaleFleet(b *testing.B) {
	nodes := largeFleetNodes(b)
	srv := scaleFleet(b, nodes)
	kubeconfig := writeKubeconfig(b, srv.config())
	b.Setenv("KUBECONFIG", "")
	gpus := nodes * deviceschema.DefaultCount
	for _, bc := range []benchCase{
		{"why", []string{"why", "pod/" + scaleWhy, "-n", scaleNamespace},
			fmt.Sprintf("DevicesAllocated: %d matching devices on the %d nodes", gpus, nodes)},
		{"status", []string{"status"}, fmt.Sprintf(`(?m)^LATEST-GPU-MODEL +%d +0 +%d`, gpus/10*6, gpus/10*6)},
	} {
		args := append(bc.args, "--kubeconfig", kubeconfig)
		// The first run has the server encode every page, with no bound on a request's time.
		if r := run(b, "", append(args, "--request-timeout=0")...); r.code != 0 {
			b.Fatalf("%v: exit %d\n%s", bc.args, r.code, r.stderr)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			runBenchCase(b, bc, args)
		})
	}
}

// scaleFleet serves the claims phase's fleet of n nodes (BenchmarkScaleFleet).
func scaleFleet(t testing.TB, n int) *protoServer {
	t.Helper()
	groups, err := nodegroups.LoadConfig(scaleNodeGroups)
	if err != nil {
		t.Fatal(err)
	}
	driver := deviceschema.DefaultDriverName
	created := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	node := func(i int) metav1.PartialObjectMetadata {
		name := fmt.Sprintf("scale-node-%05d", i)
		labels := map[string]string{corev1.LabelHostname: name, "type": "kwok"}
		switch i % 10 {
		case 6, 7, 8:
			labels[scaleGroupLabel] = "h200"
		case 9:
			labels[scaleGroupLabel] = "l4"
		}
		resources := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi")}
		return metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "PartialObjectMetadata"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, UID: uid(1, i), ResourceVersion: strconv.Itoa(100 + i), CreationTimestamp: created,
				ManagedFields: []metav1.ManagedFieldsEntry{
					managed(t, created, "v1", "", map[string]any{"metadata": map[string]any{"labels": labels}}),
					managed(t, created, "v1", "status", map[string]any{"status": corev1.NodeStatus{Capacity: resources, Allocatable: resources}}),
				}}}
	}
	slice := func(i int) resourceapi.ResourceSlice {
		nd := node(i)
		res, err := plugin.Resources(context.Background(), nd.Name, simulated.New(nd.Name, groups.ForNode(nd.Labels)), plugin.CountersInOwnSlices)
		if err != nil {
			t.Fatal(err)
		}
		spec := resourceapi.ResourceSliceSpec{Driver: driver, NodeName: ptr.To(nd.Name), Pool: resourceapi.ResourcePool{Name: nd.Name, Generation: 1, ResourceSliceCount: 1},
			Devices: res.Pools[nd.Name].Slices[0].Devices}
		owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: nd.Name, UID: nd.UID, Controller: ptr.To(true)}}
		return resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: nd.Name + "-" + driver + "-x7k2p", GenerateName: nd.Name + "-" + driver + "-",
			UID: uid(2, i), ResourceVersion: strconv.Itoa(10000 + i), Generation: 1, CreationTimestamp: created, OwnerReferences: owner,
			ManagedFields: []metav1.ManagedFieldsEntry{managed(t, created, "resource.k8s.io/v1", "",
				map[string]any{"metadata": map[string]any{"generateName": "", "ownerReferences": owner}, "spec": spec})}},
			Spec: spec}
	}
	claim := func(ns, name string, i int, spec resourceapi.ResourceClaimSpec, alloc *resourceapi.AllocationResult) resourceapi.ResourceClaim {
		labels := map[string]string{"app": "scale-held"}
		c := resourceapi.ResourceClaim{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, UID: uid(3, i), ResourceVersion: strconv.Itoa(20000 + i), CreationTimestamp: created,
				ManagedFields: []metav1.ManagedFieldsEntry{managed(t, created, "resource.k8s.io/v1", "", map[string]any{"metadata": map[string]any{"labels": labels}, "spec": spec})}},
			Spec: spec}
		if alloc != nil {
			c.Status.Allocation = alloc
			c.ManagedFields = append(c.ManagedFields, managed(t, created, "resource.k8s.io/v1", "status", map[string]any{"status": c.Status}))
		}
		return c
	}
	request := func(count int64) resourceapi.ResourceClaimSpec {
		return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}}}}
	}
	held := n * deviceschema.DefaultCount
	// Claim i holds GPU i/n of node i%n: the harness's order, every node's first GPU first.
	heldClaim := func(i int) resourceapi.ResourceClaim {
		nd := fmt.Sprintf("scale-node-%05d", i%n)
		alloc := &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: driver, Pool: nd, Device: deviceschema.DeviceName(i / n)}}},
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{nd}}}}}},
		}
		return claim(fmt.Sprintf("scale-claims-%02d", i%scaleNamespaces), fmt.Sprintf("held-%05d", i), i, request(1), alloc)
	}
	// The API server lists claims by namespace and name: the held claims of each of the
	// scale-claims-NN namespaces, then scale-load's.
	byName := make([]int, 0, held)
	for ns := range scaleNamespaces {
		for i := ns; i < held; i += scaleNamespaces {
			byName = append(byName, i)
		}
	}
	whyClaim := claim(scaleNamespace, scaleWhy, held, request(8), nil)
	class := resourceapi.DeviceClass{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{Name: driver, UID: uid(4, 0), ResourceVersion: "5", CreationTimestamp: created},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: scaleClassSelect}}},
			ExtendedResourceName: ptr.To(driver + "/gpu")}}
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: scaleNamespace, Name: scaleWhy, UID: uid(5, 0), ResourceVersion: "6", CreationTimestamp: created},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(scaleWhy)}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
			Reason: "Unschedulable", Message: "0/" + strconv.Itoa(n) + " nodes are available: " + strconv.Itoa(n) + " cannot allocate all claims."}}}}
	resourceList := func(kind string) metav1.TypeMeta {
		return metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: kind}
	}
	return startProtoServer(t, map[string]runtime.Object{
		"/api/v1/namespaces/" + scaleNamespace + "/pods/" + scaleWhy:                            pod,
		"/apis/resource.k8s.io/v1/namespaces/" + scaleNamespace + "/resourceclaims/" + scaleWhy: &whyClaim,
	}, map[string]*protoList{
		"/api/v1/nodes": {n: n, page: func(from, to int) runtime.Object {
			l := &metav1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "PartialObjectMetadataList"}}
			for i := from; i < to; i++ {
				l.Items = append(l.Items, node(i))
			}
			return l
		}},
		"/apis/resource.k8s.io/v1/resourceslices": {n: n, page: func(from, to int) runtime.Object {
			l := &resourceapi.ResourceSliceList{TypeMeta: resourceList("ResourceSliceList")}
			for i := from; i < to; i++ {
				l.Items = append(l.Items, slice(i))
			}
			return l
		}},
		"/apis/resource.k8s.io/v1/resourceclaims": {n: held + 1, page: func(from, to int) runtime.Object {
			l := &resourceapi.ResourceClaimList{TypeMeta: resourceList("ResourceClaimList")}
			for i := from; i < to; i++ {
				if i == held {
					l.Items = append(l.Items, whyClaim)
					continue
				}
				l.Items = append(l.Items, heldClaim(byName[i]))
			}
			return l
		}},
		"/apis/resource.k8s.io/v1/deviceclasses": {n: 1, page: func(from, to int) runtime.Object {
			return &resourceapi.DeviceClassList{TypeMeta: resourceList("DeviceClassList"), Items: []resourceapi.DeviceClass{class}[from:to]}
		}},
		"/apis/resource.k8s.io/v1/devicetaintrules": {n: 0, page: func(int, int) runtime.Object {
			return &resourceapi.DeviceTaintRuleList{TypeMeta: resourceList("DeviceTaintRuleList")}
		}},
	})
}

func uid(kind, i int) types.UID {
	return types.UID(fmt.Sprintf("00000000-0000-4000-%04d-%012d", kind, i))
}

// managed is the managedFields entry the API server records for an update of fields by the
// harness: every field of fields as JSON encodes it (fieldSet).
func managed(t testing.TB, at metav1.Time, apiVersion, subresource string, fields any) metav1.ManagedFieldsEntry {
	data, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	set, err := json.Marshal(fieldSet(v, true))
	if err != nil {
		t.Fatal(err)
	}
	return metav1.ManagedFieldsEntry{Manager: "scale", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: apiVersion, Time: &at,
		FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(string(set)), Subresource: subresource}
}

// fieldSet is v's fields as a FieldsV1 set names them: "f:" fields, "k:" list entries keyed by
// name, "." for a map that is itself set.
func fieldSet(v any, root bool) map[string]any {
	out := map[string]any{}
	switch v := v.(type) {
	case map[string]any:
		if !root {
			out["."] = map[string]any{}
		}
		for k, e := range v {
			out["f:"+k] = fieldSet(e, false)
		}
	case []any:
		for _, e := range v {
			if m, ok := e.(map[string]any); ok && m["name"] != nil {
				key, _ := json.Marshal(map[string]any{"name": m["name"]})
				out["k:"+string(key)] = fieldSet(e, false)
			}
		}
	}
	return out
}
