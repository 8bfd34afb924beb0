package simulated

import (
	"context"
	"fmt"
	"regexp"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

var uuidFormat = regexp.MustCompile(`^gpu-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func TestDeviceUUID(t *testing.T) {
	seen := map[string]string{}
	for _, node := range []string{"las1", "las2", "las3"} {
		for i := 0; i < 8; i++ {
			u := DeviceUUID(node, i)
			if !uuidFormat.MatchString(u) {
				t.Errorf("DeviceUUID(%s, %d) = %q, not like gpu-94011f0b-8dcd-b4b0-cd99-40eab2e3c96a", node, i, u)
			}
			if again := DeviceUUID(node, i); again != u {
				t.Errorf("DeviceUUID(%s, %d) not stable: %q then %q", node, i, u, again)
			}
			if other, dup := seen[u]; dup {
				t.Errorf("DeviceUUID(%s, %d) = %q collides with %s", node, i, u, other)
			}
			seen[u] = node
		}
	}
	// Node name and index must not be ambiguous when concatenated.
	if DeviceUUID("node1", 11) == DeviceUUID("node11", 1) {
		t.Error("node1/11 and node11/1 share a UUID")
	}
}

func TestSimulatedDevices(t *testing.T) {
	small := resource.MustParse("16Gi")
	tests := []struct {
		name       string
		spec       nodegroups.GroupSpec
		wantCount  int
		wantModel  string
		wantMemory string
	}{
		{name: "defaults", wantCount: 8, wantModel: deviceschema.DefaultModel, wantMemory: "80Gi"},
		{name: "small", spec: nodegroups.GroupSpec{Count: 2, Model: "SMALL-GPU", Memory: &small}, wantCount: 2, wantModel: "SMALL-GPU", wantMemory: "16Gi"},
		{name: "count only inherits model and memory", spec: nodegroups.GroupSpec{Count: 16}, wantCount: 16, wantModel: deviceschema.DefaultModel, wantMemory: "80Gi"},
	}
	schema := deviceschema.DeviceSchema()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			devices, err := New("node-a", tc.spec).Devices(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(devices) != tc.wantCount {
				t.Fatalf("%d devices, want %d", len(devices), tc.wantCount)
			}
			for i, d := range devices {
				if d.Name != deviceschema.DeviceName(i) {
					t.Errorf("device %d named %q, want gpu-%d", i, d.Name, i)
				}
				everyDevice := 0
				for _, a := range schema.Attributes {
					if a.Only != "" {
						if _, ok := d.Attributes[a.Name]; ok {
							t.Errorf("%s publishes %s, which only %s do", d.Name, a.Name, a.Only)
						}
						continue
					}
					everyDevice++
					v, ok := d.Attributes[a.Name]
					if !ok || attrType(v) != a.Type {
						t.Errorf("%s attribute %s = %+v, want type %s", d.Name, a.Name, v, a.Type)
					}
				}
				if len(d.Attributes) != everyDevice {
					t.Errorf("%s has attributes %v, schema has %d on every device", d.Name, d.Attributes, everyDevice)
				}
				if got := *d.Attributes[deviceschema.AttrIndex].IntValue; got != int64(i) {
					t.Errorf("%s index = %d", d.Name, got)
				}
				if got := *d.Attributes[deviceschema.AttrModel].StringValue; got != tc.wantModel {
					t.Errorf("%s model = %q, want %q", d.Name, got, tc.wantModel)
				}
				if got := *d.Attributes[deviceschema.AttrDriverVersion].VersionValue; got != "1.0.0" {
					t.Errorf("%s driverVersion = %q", d.Name, got)
				}
				if got := *d.Attributes[deviceschema.AttrUUID].StringValue; got != DeviceUUID("node-a", i) {
					t.Errorf("%s uuid = %q", d.Name, got)
				}
				mem := d.Capacity[deviceschema.CapMemory].Value
				if want := resource.MustParse(tc.wantMemory); mem.Cmp(want) != 0 {
					t.Errorf("%s memory = %s, want %s", d.Name, mem.String(), tc.wantMemory)
				}
				for _, gated := range []bool{d.AllowMultipleAllocations != nil, len(d.Taints) > 0, len(d.ConsumesCounters) > 0, d.BindsToNode != nil, len(d.BindingConditions) > 0} {
					if gated {
						t.Errorf("%s sets a feature-gated field: %+v", d.Name, d)
					}
				}
			}
		})
	}
}

func TestSharedMemoryDevices(t *testing.T) {
	q := resource.MustParse
	tests := []struct {
		name    string
		sharing nodegroups.Sharing
		memory  string
		// want are value, default, min, step, max of memory and then of compute.
		want [2][5]string
	}{
		{name: "reference defaults", sharing: nodegroups.Sharing{Mode: nodegroups.SharedMemory},
			want: [2][5]string{{"80Gi", "80Gi", "1Gi", "1Gi", "80Gi"}, {"100", "100", "1", "1", "100"}}},
		{name: "tuned, max caps the default", memory: "40Gi", sharing: nodegroups.Sharing{Mode: nodegroups.SharedMemory,
			Memory:  &nodegroups.CapacityPolicy{Min: ptr.To(q("4Gi")), Step: ptr.To(q("2Gi")), Max: ptr.To(q("20Gi"))},
			Compute: &nodegroups.CapacityPolicy{Min: ptr.To(q("10")), Step: ptr.To(q("10"))}},
			want: [2][5]string{{"40Gi", "20Gi", "4Gi", "2Gi", "20Gi"}, {"100", "100", "10", "10", "100"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := nodegroups.GroupSpec{Count: 2, Sharing: &tc.sharing}
			if tc.memory != "" {
				spec.Memory = ptr.To(q(tc.memory))
			}
			devices, err := New("node-a", spec).Devices(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range devices {
				if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
					t.Errorf("%s: allowMultipleAllocations %v", d.Name, d.AllowMultipleAllocations)
				}
				for i, name := range []resourceapi.QualifiedName{deviceschema.CapMemory, deviceschema.CapCompute} {
					c, ok := d.Capacity[name]
					if !ok || c.RequestPolicy == nil || c.RequestPolicy.Default == nil || c.RequestPolicy.ValidRange == nil {
						t.Fatalf("%s %s: %+v", d.Name, name, c)
					}
					r := c.RequestPolicy.ValidRange
					got := [5]string{c.Value.String(), c.RequestPolicy.Default.String(), r.Min.String(), r.Step.String(), r.Max.String()}
					if got != tc.want[i] {
						t.Errorf("%s %s: value/default/min/step/max %v, want %v", d.Name, name, got, tc.want[i])
					}
				}
			}
		})
	}
	// Exclusive, said so or not, publishes what it always did: no compute, no policy.
	for _, sharing := range []*nodegroups.Sharing{nil, {Mode: nodegroups.Exclusive}} {
		devices, _ := New("node-a", nodegroups.GroupSpec{Sharing: sharing}).Devices(context.Background())
		if d := devices[0]; d.AllowMultipleAllocations != nil || len(d.Capacity) != 1 || d.Capacity[deviceschema.CapMemory].RequestPolicy != nil {
			t.Errorf("exclusive (%+v) device %+v", sharing, d)
		}
	}
}

func TestSimulatedDefaults(t *testing.T) {
	devices, _ := New("n", nodegroups.GroupSpec{}).Devices(context.Background())
	if len(devices) != deviceschema.DefaultCount {
		t.Fatalf("%d devices, want %d", len(devices), deviceschema.DefaultCount)
	}
}

func attrType(a resourceapi.DeviceAttribute) deviceschema.AttributeType {
	switch {
	case a.IntValue != nil:
		return deviceschema.IntType
	case a.StringValue != nil:
		return deviceschema.StringType
	case a.BoolValue != nil:
		return deviceschema.BoolType
	case a.VersionValue != nil:
		return deviceschema.VersionType
	}
	return ""
}

func TestPartitionedDevices(t *testing.T) {
	for _, tc := range []struct {
		partitions int
		// want are the memory and compute of one partition (rounded down).
		wantMemory, wantCompute string
	}{
		{partitions: 4, wantMemory: "20Gi", wantCompute: "25"},
		{partitions: 3, wantMemory: "28633115306", wantCompute: "33"},
		{partitions: 1, wantMemory: "80Gi", wantCompute: "100"},
	} {
		for _, mode := range []nodegroups.SharingMode{nodegroups.Partitioned, nodegroups.SharedPartitions} {
			t.Run(fmt.Sprintf("%s/%d", mode, tc.partitions), func(t *testing.T) { checkPartitions(t, mode, tc.partitions, tc.wantMemory, tc.wantCompute) })
		}
	}
	// Other modes publish no counters.
	sets, _ := New("node-a", nodegroups.GroupSpec{Sharing: &nodegroups.Sharing{Mode: nodegroups.SharedMemory}}).SharedCounters(context.Background())
	if sets != nil {
		t.Errorf("shared-memory GPUs publish counter sets %v", sets)
	}
}

// checkPartitions: two GPUs of the mode, each its partitions and then the whole GPU; in mode
// shared-partitions every one of them shared, with request policies up to its own capacity.
func checkPartitions(t *testing.T, mode nodegroups.SharingMode, partitions int, wantMemory, wantCompute string) {
	t.Helper()
	spec := nodegroups.GroupSpec{Count: 2, Sharing: &nodegroups.Sharing{Mode: mode, Partitions: partitions}}
	gpus := New("node-a", spec)
	devices, err := gpus.Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sets, err := gpus.SharedCounters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(devices) != 2*(partitions+1) || len(sets) != 2 {
		t.Fatalf("%d devices and %d counter sets, want %d and 2", len(devices), len(sets), 2*(partitions+1))
	}
	for i, set := range sets {
		if set.Name != fmt.Sprintf("gpu-%d-counters", i) || qstr(set.Counters["memory"].Value) != "80Gi" || qstr(set.Counters["compute"].Value) != "100" {
			t.Errorf("counter set %d: %+v", i, set)
		}
	}
	for n, d := range devices {
		gpu, j := n/(partitions+1), n%(partitions+1)
		name, memory, compute := fmt.Sprintf("gpu-%d-partition-%d", gpu, j), wantMemory, wantCompute
		if j == partitions {
			name, memory, compute = fmt.Sprintf("gpu-%d-full", gpu), "80Gi", "100"
		}
		if d.Name != name {
			t.Fatalf("device %d is %s, want %s", n, d.Name, name)
		}
		if *d.Attributes["index"].IntValue != int64(gpu) || !*d.Attributes["partitionable"].BoolValue ||
			*d.Attributes["uuid"].StringValue != DeviceUUID("node-a", gpu) {
			t.Errorf("%s: attributes %v", d.Name, d.Attributes)
		}
		if p, full := d.Attributes["partition"], d.Attributes["full"]; (j < partitions) != (p.IntValue != nil && *p.IntValue == int64(j)) ||
			(j == partitions) != (full.BoolValue != nil && *full.BoolValue) {
			t.Errorf("%s: partition %v full %v", d.Name, p, full)
		}
		if qstr(d.Capacity["memory"].Value) != memory || qstr(d.Capacity["compute"].Value) != compute {
			t.Errorf("%s: capacity %v, want memory %s compute %s", d.Name, d.Capacity, memory, compute)
		}
		shared := mode == nodegroups.SharedPartitions
		if (d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations) != shared {
			t.Errorf("%s: allowMultipleAllocations %v, want %v", d.Name, d.AllowMultipleAllocations, shared)
		}
		for name, total := range map[resourceapi.QualifiedName]string{"memory": memory, "compute": compute} {
			p := d.Capacity[name].RequestPolicy
			if got := p != nil && p.ValidRange != nil && p.ValidRange.Max != nil && qstr(*p.ValidRange.Max) == total; got != shared {
				t.Errorf("%s: %s request policy %+v; want one up to %s: %v", d.Name, name, p, total, shared)
			}
		}
		if c := d.ConsumesCounters; len(c) != 1 || c[0].CounterSet != fmt.Sprintf("gpu-%d-counters", gpu) ||
			qstr(c[0].Counters["memory"].Value) != memory || qstr(c[0].Counters["compute"].Value) != compute {
			t.Errorf("%s: consumes %+v", d.Name, c)
		}
	}
}

func qstr(q resource.Quantity) string { return q.String() }

// TestAttachableDevices: an attachable GPU is the exclusive GPU plus its binding conditions; the
// other modes publish none.
func TestAttachableDevices(t *testing.T) {
	exclusive, _ := New("node-a", nodegroups.GroupSpec{Count: 2}).Devices(context.Background())
	devices, err := New("node-a", nodegroups.GroupSpec{Count: 2, Sharing: &nodegroups.Sharing{Mode: nodegroups.Attachable}}).Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(devices) != len(exclusive) {
		t.Fatalf("%d devices, want %d", len(devices), len(exclusive))
	}
	for i, d := range devices {
		if fmt.Sprint(d.BindingConditions) != "[Attached]" || fmt.Sprint(d.BindingFailureConditions) != "[AttachFailed]" || d.BindsToNode != nil {
			t.Errorf("%s: bindingConditions %v, bindingFailureConditions %v, bindsToNode %v; want [Attached], [AttachFailed], unset",
				d.Name, d.BindingConditions, d.BindingFailureConditions, d.BindsToNode)
		}
		d.BindingConditions, d.BindingFailureConditions = nil, nil
		if !apiequality.Semantic.DeepEqual(d, exclusive[i]) {
			t.Errorf("%s: %+v, want the exclusive device %+v with binding conditions", d.Name, d, exclusive[i])
		}
	}
	for _, mode := range []nodegroups.SharingMode{nodegroups.Exclusive, nodegroups.SharedMemory} {
		devices, _ := New("node-a", nodegroups.GroupSpec{Sharing: &nodegroups.Sharing{Mode: mode}}).Devices(context.Background())
		if len(devices[0].BindingConditions) > 0 {
			t.Errorf("mode %s publishes binding conditions %v", mode, devices[0].BindingConditions)
		}
	}
}
