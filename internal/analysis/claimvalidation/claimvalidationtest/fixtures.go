// Package claimvalidationtest holds the fixtures the tests of the claim validation and of its
// admission handler share: the inventory, node groups and rule cases of
// internal/analysis/claimvalidation/testdata, read from the directory a test names.
package claimvalidationtest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility/feasibilitytest"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// Driver is the driver the fixtures publish for.
const Driver = "gpu.example.com"

type nodeSpec struct {
	Name     string `json:"name"`
	GPUs     int    `json:"gpus"`
	Model    string `json:"model"`
	OddModel string `json:"oddModel"`
	Memory   string `json:"memory"`
	NICs     int    `json:"nics"`
}

type inventoryFile struct {
	Nodes   []nodeSpec                `json:"nodes"`
	Classes []resourceapi.DeviceClass `json:"classes"`
}

// GPUSlice is what the driver publishes for one node: one pool, devices gpu-<i>; with oddModel,
// the odd devices are of that model.
func GPUSlice(node string, n int, model, oddModel string, memory resource.Quantity) *resourceapi.ResourceSlice {
	return feasibilitytest.GPUSlice(node, n, func(i int) string {
		if oddModel != "" && i%2 == 1 {
			return oddModel
		}
		return model
	}, memory.String())
}

func nicSlice(node string, n int) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-nic.example.com"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   "nic.example.com",
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
		},
	}
	for i := range n {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
			Name:       fmt.Sprintf("nic-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"speed": {IntValue: ptr.To(int64(100))}},
		})
	}
	return s
}

// Inventory reads dir/inventory.yaml into an in-memory inventory.
func Inventory(tb testing.TB, dir string) *inventory.Objects {
	tb.Helper()
	file := filepath.Join(dir, "inventory.yaml")
	data, err := os.ReadFile(file)
	if err != nil {
		tb.Fatal(err)
	}
	var f inventoryFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		tb.Fatalf("%s: %v", file, err)
	}
	st := &inventory.Objects{}
	for _, n := range f.Nodes {
		st.Nodes = append(st.Nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}})
		st.Slices = append(st.Slices, GPUSlice(n.Name, n.GPUs, n.Model, n.OddModel, resource.MustParse(n.Memory)))
		if n.NICs > 0 {
			st.Slices = append(st.Slices, nicSlice(n.Name, n.NICs))
		}
	}
	for i := range f.Classes {
		st.Classes = append(st.Classes, &f.Classes[i])
	}
	return st
}

// NewValidator is the validator as gpu-webhook runs it, over lister and the node groups of
// dir/node-groups.yaml.
func NewValidator(tb testing.TB, dir string, lister feasibility.Lister, deny ...claimvalidation.Rule) *claimvalidation.Validator {
	tb.Helper()
	cfg, err := nodegroups.LoadConfig(filepath.Join(dir, "node-groups.yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	return claimvalidation.New(Driver, cfg, deny, lister)
}

// RuleCase is one case of cases.yaml: an object, the rules that deny, and the findings.
type RuleCase struct {
	Name         string                 `json:"name"`
	Deny         []claimvalidation.Rule `json:"deny"`
	NotOurs      bool                   `json:"notOurs"`
	BetaOnly     bool                   `json:"betaOnly"`
	Object       json.RawMessage        `json:"object"`
	Denied       []string               `json:"denied"`
	DeniedPrefix []string               `json:"deniedPrefix"`
	Warnings     []string               `json:"warnings"`
}

// RuleCases reads dir/cases.yaml.
func RuleCases(tb testing.TB, dir string) []RuleCase {
	tb.Helper()
	file := filepath.Join(dir, "cases.yaml")
	data, err := os.ReadFile(file)
	if err != nil {
		tb.Fatal(err)
	}
	var cases []RuleCase
	if err := yaml.UnmarshalStrict(data, &cases); err != nil {
		tb.Fatalf("%s: %v", file, err)
	}
	return cases
}

// AsVersion decodes a v1 object and converts it to version, the way the API server serves it.
func AsVersion(tb testing.TB, raw []byte, version string) runtime.Object {
	tb.Helper()
	obj, err := resourceversion.Decode(raw, schema.GroupVersionKind{})
	if err != nil {
		tb.Fatal(err)
	}
	out, err := obj.To(version)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}
