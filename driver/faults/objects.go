package faults

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
)

// Each node's simulated faults are in a ConfigMap of their own, so that a change reaches only the
// plugin of that node: every plugin watches one object by name, whatever the size of the fleet.
// The objects of one release share a base name, the chart's <release>-faults: that ConfigMap is
// the anchor (it says the release has simulated faults on and owns the per-node objects, which
// the garbage collector then deletes with it); ObjectName(base, node) holds the node's entry under
// the key <node name>, as ParseEntry reads it; and the label SetLabel=<base> finds them all.
const (
	// SetLabel on a per-node object names its base; `kubectl dra fault list` and the chart's
	// uninstall hook select by it.
	SetLabel = "app.kubernetes.io/part-of"
	// ComponentLabel is app.kubernetes.io/component=ComponentValue on every per-node object.
	ComponentLabel = "app.kubernetes.io/component"
	ComponentValue = "faults"
	// ManagedByLabel says who writes the per-node objects.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "kubectl-dra"
)

// hashLength is the number of hex digits of a node name's digest in a shortened object name.
const hashLength = 16

// ValidateBase checks a base name: a ConfigMap name that is also a label value.
func ValidateBase(base string) error {
	if msgs := validation.IsDNS1123Subdomain(base); len(msgs) > 0 {
		return fmt.Errorf("%q is not a ConfigMap name: %s", base, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsValidLabelValue(base); len(msgs) > 0 {
		return fmt.Errorf("%q is not a label value (at most 63 characters): %s", base, strings.Join(msgs, "; "))
	}
	return nil
}

// ObjectName is the name of node's ConfigMap: <base>-<node>, or, where that exceeds the 253
// characters of a name, <base>-<start of node>-<digest of node>. base and node must be DNS
// subdomains (a node's name is one), so the result is one too.
func ObjectName(base, node string) string {
	name := base + "-" + node
	if len(name) <= validation.DNS1123SubdomainMaxLength {
		return name
	}
	sum := sha256.Sum256([]byte(node))
	digest := hex.EncodeToString(sum[:])[:hashLength]
	keep := validation.DNS1123SubdomainMaxLength - len(base) - len(digest) - 2
	// A DNS label may not end in '-' or '.' before the '-' that joins the digest.
	start := strings.TrimRight(node[:max(keep, 0)], "-.")
	if start == "" {
		return base + "-" + digest
	}
	return base + "-" + start + "-" + digest
}

// Selector selects every per-node object of base.
func Selector(base string) string {
	return ComponentLabel + "=" + ComponentValue + "," + SetLabel + "=" + base
}

// NewObject is node's ConfigMap holding value, owned by the anchor when it is given.
func NewObject(namespace, base, node, value string, anchor *corev1.ConfigMap) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name:      ObjectName(base, node),
			Namespace: namespace,
			Labels: map[string]string{
				ComponentLabel: ComponentValue,
				SetLabel:       base,
				ManagedByLabel: ManagedByValue,
			},
		},
		Data: map[string]string{node: value},
	}
	if anchor != nil {
		cm.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: anchor.Name, UID: anchor.UID}}
	}
	return cm
}

// NodeOf returns the node whose entry cm holds: the one key whose object name is cm's. Other keys
// (written by hand, or the entries of a single ConfigMap of an earlier version) are not anyone's.
func NodeOf(base string, cm *corev1.ConfigMap) (string, bool) {
	for key := range cm.Data {
		if ObjectName(base, key) == cm.Name {
			return key, true
		}
	}
	return "", false
}

// DeleteAll deletes every per-node object of base in namespace (the chart's uninstall hook): they
// are created at run time, so the release does not own them.
func DeleteAll(ctx context.Context, client kubernetes.Interface, namespace, base string) error {
	err := client.CoreV1().ConfigMaps(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: Selector(base)})
	if err != nil {
		return fmt.Errorf("delete the faults ConfigMaps of %s/%s (%s): %w", namespace, base, Selector(base), err)
	}
	return nil
}
