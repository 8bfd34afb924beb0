package faults

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestObjectName(t *testing.T) {
	long := strings.Repeat("a", 63)
	for _, tc := range []struct {
		name, base, node, want string
	}{
		{name: "short", base: "gpu-dra-faults", node: "las1", want: "gpu-dra-faults-las1"},
		{name: "dotted", base: "gpu-dra-faults", node: "ip-10-0-0-1.ec2.internal", want: "gpu-dra-faults-ip-10-0-0-1.ec2.internal"},
		{name: "253 characters", base: "f", node: strings.Repeat("n", 251), want: "f-" + strings.Repeat("n", 251)},
		{name: "longest node", base: long, node: strings.Join([]string{long, long, long, strings.Repeat("b", 61)}, ".")},
		{name: "cut before a dot", base: long, node: strings.Repeat("a", 170) + "." + strings.Repeat("b", 82)},
		{name: "cut before a dash", base: long, node: strings.Repeat("a", 171) + "-" + strings.Repeat("b", 81)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if msgs := validation.IsDNS1123Subdomain(tc.node); len(msgs) > 0 {
				t.Fatalf("bad test node name: %v", msgs)
			}
			got := ObjectName(tc.base, tc.node)
			if msgs := validation.IsDNS1123Subdomain(got); len(msgs) > 0 {
				t.Errorf("ObjectName = %q (%d characters), not a ConfigMap name: %v", got, len(got), msgs)
			}
			if tc.want != "" && got != tc.want {
				t.Errorf("ObjectName = %q, want %q", got, tc.want)
			}
			if !strings.HasPrefix(got, tc.base+"-") {
				t.Errorf("ObjectName = %q, want the prefix %q", got, tc.base+"-")
			}
		})
	}
	// Long names that differ only past the cut get different objects.
	a := ObjectName(long, strings.Repeat("a", 252)+"x")
	b := ObjectName(long, strings.Repeat("a", 252)+"y")
	if a == b {
		t.Errorf("two nodes share the object %q", a)
	}
}

func TestNodeOf(t *testing.T) {
	cm := NewObject("gpu-dra", "gpu-dra-faults", "las1", good, nil)
	cm.Data["las2"] = good // written by hand: not this object's node
	if node, ok := NodeOf("gpu-dra-faults", cm); !ok || node != "las1" {
		t.Errorf("NodeOf = %q, %v; want las1", node, ok)
	}
	cm.Name = "gpu-dra-faults"
	if node, ok := NodeOf("gpu-dra-faults", cm); ok {
		t.Errorf("the anchor is node %q's object", node)
	}
}

func TestValidateBase(t *testing.T) {
	for base, want := range map[string]string{
		"gpu-dra-faults":        "",
		"Faults":                "not a ConfigMap name",
		strings.Repeat("f", 64): "not a label value",
	} {
		err := ValidateBase(base)
		if (err == nil) != (want == "") || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("%q: %v, want %q", base, err, want)
		}
	}
}
