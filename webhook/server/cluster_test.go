package server

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

// node is what the driver publishes on one node of the test cluster.
type node struct {
	name     string
	gpus     int
	model    string
	oddModel string
	memory   string
	nics     int
}

// testCluster mirrors internal/analysis/claimvalidation/testdata/inventory.yaml.
var testCluster = []node{
	{name: "las1", gpus: 8, model: "LATEST-GPU-MODEL", memory: "80Gi", nics: 2},
	{name: "las2", gpus: 8, model: "LATEST-GPU-MODEL", memory: "80Gi"},
	{name: "las3", gpus: 8, model: "LATEST-GPU-MODEL", memory: "80Gi"},
	{name: "las4", gpus: 4, model: "OLD-GPU-MODEL", memory: "40Gi"},
	{name: "las5", gpus: 4, model: "LATEST-GPU-MODEL", oddModel: "OLD-GPU-MODEL", memory: "80Gi"},
}

func slice(driver, nodeName string) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName + "-" + driver},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driver,
			NodeName: ptr.To(nodeName),
			Pool:     resourceapi.ResourcePool{Name: nodeName, ResourceSliceCount: 1},
		},
	}
}

// populate creates Nodes, DeviceClasses and ResourceSlices in whatever resource.k8s.io version
// the server serves.
func populate(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	dra := draclient.New(cs)
	for _, d := range []string{"gpu.example.com", "nic.example.com"} {
		class := &resourceapi.DeviceClass{
			ObjectMeta: metav1.ObjectMeta{Name: d},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
				CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", d)},
			}}},
		}
		if _, err := dra.DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create DeviceClass %s: %v", d, err)
		}
	}
	for _, n := range testCluster {
		if _, err := cs.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create Node %s: %v", n.name, err)
		}
		s := slice("gpu.example.com", n.name)
		for i := range n.gpus {
			m := n.model
			if n.oddModel != "" && i%2 == 1 {
				m = n.oddModel
			}
			s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
				Name: fmt.Sprintf("gpu-%d", i),
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
					deviceschema.AttrIndex:         {IntValue: ptr.To(int64(i))},
					deviceschema.AttrUUID:          {StringValue: ptr.To(fmt.Sprintf("gpu-%s-%d", n.name, i))},
					deviceschema.AttrModel:         {StringValue: ptr.To(m)},
					deviceschema.AttrDriverVersion: {VersionValue: ptr.To(deviceschema.DefaultDriverVersion)},
				},
				Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{deviceschema.CapMemory: {Value: resource.MustParse(n.memory)}},
			})
		}
		if _, err := dra.ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ResourceSlice for %s: %v", n.name, err)
		}
		if n.nics == 0 {
			continue
		}
		s = slice("nic.example.com", n.name)
		for i := range n.nics {
			s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
				Name:       fmt.Sprintf("nic-%d", i),
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"speed": {IntValue: ptr.To(int64(100))}},
			})
		}
		if _, err := dra.ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create NIC ResourceSlice for %s: %v", n.name, err)
		}
	}
}
