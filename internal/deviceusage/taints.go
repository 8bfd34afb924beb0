package deviceusage

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
)

// applyTaintRules adds each DeviceTaintRule's taint to the devices its selector names, as the
// scheduler's ResourceSlice tracker does (k8s.io/dynamic-resource-allocation/resourceslice/tracker,
// applyPatches: no selector matches nothing, unset fields match everything). The tracker needs
// informers and does not say which rule added a taint, which a one-shot report must: rules lists,
// per device, the rule of each added taint in order. Slices without a matching rule are returned
// as they are, the others as copies.
func applyTaintRules(in []*resourceapi.ResourceSlice, taintRules []*resourceapi.DeviceTaintRule) ([]*resourceapi.ResourceSlice, map[structured.DeviceID][]string) {
	rules := map[structured.DeviceID][]string{}
	if len(taintRules) == 0 {
		return in, rules
	}
	out := make([]*resourceapi.ResourceSlice, 0, len(in))
	for _, slice := range in {
		patched := slice
		for _, rule := range taintRules {
			sel := rule.Spec.DeviceSelector
			if sel == nil {
				continue
			}
			if sel.Driver != nil && *sel.Driver != slice.Spec.Driver {
				continue
			}
			if sel.Pool != nil && *sel.Pool != slice.Spec.Pool.Name {
				continue
			}
			for i := range slice.Spec.Devices {
				name := slice.Spec.Devices[i].Name
				if sel.Device != nil && *sel.Device != name {
					continue
				}
				if patched == slice {
					patched = slice.DeepCopy()
				}
				patched.Spec.Devices[i].Taints = append(patched.Spec.Devices[i].Taints, rule.Spec.Taint)
				id := structured.MakeDeviceID(slice.Spec.Driver, slice.Spec.Pool.Name, name)
				rules[id] = append(rules[id], rule.Name)
			}
		}
		out = append(out, patched)
	}
	return out, rules
}

// taintsOf describes a device's taints; the last len(rules) of them come from those rules.
func taintsOf(taints []resourceapi.DeviceTaint, rules []string) []Taint {
	if len(taints) == 0 {
		return nil
	}
	out := make([]Taint, 0, len(taints))
	published := len(taints) - len(rules)
	for i, t := range taints {
		tt := Taint{Key: t.Key, Value: t.Value, Effect: t.Effect, TimeAdded: t.TimeAdded}
		if i >= published {
			tt.Rule = rules[i-published]
		}
		out = append(out, tt)
	}
	return out
}

// String renders the taint as kubectl renders node taints: key=value:Effect.
func (t Taint) String() string {
	s := t.Key
	if t.Value != "" {
		s += "=" + t.Value
	}
	return s + ":" + string(t.Effect)
}
