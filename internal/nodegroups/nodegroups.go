// Package nodegroups reads the node-groups file the chart renders (values `inventory`): which nodes
// have how many GPUs of which model and memory, chosen by node labels. The plugin reads it to know
// its own node's devices, the webhook and kubectl dra to know the most devices any node can hold.
package nodegroups

import (
	"fmt"
	"os"

	"github.com/go-json-experiment/json/jsontext"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/quantity"
)

// DefaultGroupDescription says what a node has when no node-groups file is given (the flags' help
// texts of every binary that reads one).
var DefaultGroupDescription = fmt.Sprintf("%d GPUs per node", deviceschema.DefaultCount)

// configField places a value of the config for a message; every value but a node selector's
// (label values are not parsed) may be a quantity.
func configField(p jsontext.Pointer) string {
	if p.Parent().LastToken() == "nodeSelector" {
		return ""
	}
	return quantity.FieldPath(p, func(parent, _ string) bool { return parent == "nodeSelector" }).String()
}

// GroupSpec is what each node of a group has.
type GroupSpec struct {
	Count  int                `json:"count,omitempty"`
	Model  string             `json:"model,omitempty"`
	Memory *resource.Quantity `json:"memory,omitempty"`
	// Sharing is how the group's GPUs are handed out; exclusive when unset.
	Sharing *Sharing `json:"sharing,omitempty"`
}

// NodeGroup applies a GroupSpec to the nodes whose labels match NodeSelector.
type NodeGroup struct {
	Name         string            `json:"name"`
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	GroupSpec    `json:",inline"`
}

// Config is the node-group inventory file the chart renders and both the plugin and the webhook
// read: the plugin to know its own devices, the webhook to know the most any node can hold.
type Config struct {
	Defaults   GroupSpec   `json:"defaults,omitempty"`
	NodeGroups []NodeGroup `json:"nodeGroups,omitempty"`
}

// LoadConfig reads a Config file; a missing path means the defaults.
func LoadConfig(path string) (*Config, error) {
	var data []byte
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return nil, fmt.Errorf("read inventory config: %w", err)
		}
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("inventory config %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig reads and validates the content of a Config file.
func ParseConfig(data []byte) (*Config, error) {
	cfg := &Config{}
	doc, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, err
	}
	// The decoder parses each quantity as written, at a cost no later check bounds.
	if err := quantity.CheckJSON(doc, configField); err != nil {
		return nil, fmt.Errorf("%w; write a plain quantity such as 80Gi", err)
	}
	if err := yaml.UnmarshalStrict(data, cfg); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Validate rejects counts and names no node could publish.
func (c *Config) Validate() error {
	check := func(where string, g GroupSpec) error {
		if g.Count < 0 || g.Count > 128 {
			return fmt.Errorf("%s.count: %d is out of range; use 1..128 (0 means the default %d)", where, g.Count, deviceschema.DefaultCount)
		}
		if g.Memory != nil && g.Memory.Sign() <= 0 {
			return fmt.Errorf("%s.memory: %s must be positive, e.g. 80Gi", where, g.Memory.String())
		}
		path := where + ".sharing"
		if g.Sharing == nil && where != "defaults" {
			// Inherited: the defaults' policy must fit this group's GPUs too.
			path = fmt.Sprintf("defaults.sharing (inherited by %s)", where)
		}
		merged := c.merge(g)
		return merged.Sharing.validate(path, *merged.Memory, deviceschema.DefaultCompute)
	}
	if err := check("defaults", c.Defaults); err != nil {
		return err
	}
	for i, g := range c.NodeGroups {
		where := fmt.Sprintf("nodeGroups[%d]", i)
		if g.Name == "" {
			return fmt.Errorf("%s.name: required; give the group a name", where)
		}
		if _, err := labels.ValidatedSelectorFromSet(g.NodeSelector); err != nil {
			return fmt.Errorf("%s.nodeSelector: %w", where, err)
		}
		if err := check(where, g.GroupSpec); err != nil {
			return err
		}
	}
	return nil
}

// ForNode returns the spec of the first group whose selector matches the node's labels, on top of
// the defaults.
func (c *Config) ForNode(nodeLabels map[string]string) GroupSpec {
	_, spec := c.GroupFor(nodeLabels)
	return spec
}

// DefaultsGroup names the group of nodes that no node group selects.
const DefaultsGroup = "defaults"

// GroupFor is ForNode with the name of the group (DefaultsGroup when none matches).
func (c *Config) GroupFor(nodeLabels map[string]string) (string, GroupSpec) {
	for _, g := range c.NodeGroups {
		if labels.SelectorFromSet(g.NodeSelector).Matches(labels.Set(nodeLabels)) {
			return g.Name, c.merge(g.GroupSpec)
		}
	}
	return DefaultsGroup, c.merge(GroupSpec{})
}

// MaxDevicesPerNode is the most devices any node of this driver can ever publish.
func (c *Config) MaxDevicesPerNode() int {
	most := c.merge(GroupSpec{}).Count
	for _, g := range c.NodeGroups {
		if n := c.merge(g.GroupSpec).Count; n > most {
			most = n
		}
	}
	return most
}

// WithDefaults fills the unset fields of g from the built-in defaults.
func (g GroupSpec) WithDefaults() GroupSpec { return (&Config{}).merge(g) }

// merge fills the unset fields of g from the config's defaults, then from the built-in defaults.
func (c *Config) merge(g GroupSpec) GroupSpec {
	for _, base := range []GroupSpec{c.Defaults, {Count: deviceschema.DefaultCount, Model: deviceschema.DefaultModel, Memory: &deviceschema.DefaultMemory}} {
		if g.Count == 0 {
			g.Count = base.Count
		}
		if g.Model == "" {
			g.Model = base.Model
		}
		if g.Memory == nil {
			g.Memory = base.Memory
		}
		if g.Sharing == nil {
			g.Sharing = base.Sharing
		}
	}
	return g
}
