package claimvalidation

import (
	"fmt"
	"sort"
	"strings"
)

// Rule names a check that warns by default and denies when switched on.
type Rule string

const (
	// RuleMissingClass: a request names a DeviceClass that does not exist.
	RuleMissingClass Rule = "missing-class"
	// RuleUnsatisfiable: nothing currently published can satisfy the claim.
	RuleUnsatisfiable Rule = "unsatisfiable"
	// RuleDeprecatedVersion: the object was written as resource.k8s.io/v1beta1 or v1beta2.
	RuleDeprecatedVersion Rule = "deprecated-version"
)

// Rules lists every switchable rule: the one list the flags, their help texts and the chart's
// values (schema enum and comment, checked by charts/charttest) follow.
var Rules = []Rule{RuleMissingClass, RuleUnsatisfiable, RuleDeprecatedVersion}

// RuleNames returns the names of Rules, in their order.
func RuleNames() []string {
	names := make([]string, 0, len(Rules))
	for _, r := range Rules {
		names = append(names, string(r))
	}
	return names
}

// ParseRules reads a comma-separated list such as "missing-class,unsatisfiable".
func ParseRules(list string) ([]Rule, error) {
	var out []Rule
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		known := false
		for _, r := range Rules {
			if string(r) == s {
				known = true
				out = append(out, r)
			}
		}
		if !known {
			names := RuleNames()
			sort.Strings(names)
			return nil, fmt.Errorf("unknown rule %q; use one or more of %s", s, strings.Join(names, ", "))
		}
	}
	return out, nil
}
