// Package flagalias keeps a renamed flag's old name working for a while: setting the old name
// sets the new flag and logs one line saying it is deprecated, so that a rollout mixing the old
// chart with a new binary (or the other way round) still starts. A flag whose job went away is
// kept the same way, accepted and without effect.
package flagalias

import (
	"flag"

	"k8s.io/klog/v2"
)

// Deprecated registers old on fs as an alias of current, which must be registered already.
func Deprecated(fs *flag.FlagSet, old, current string) {
	f := fs.Lookup(current)
	if f == nil {
		panic("flagalias: --" + current + " is not registered")
	}
	fs.Var(&alias{target: f.Value, old: old, current: current}, old, "Deprecated: use --"+current+".")
}

type alias struct {
	target       flag.Value
	old, current string
}

// String is also called on a zero alias (flag.PrintDefaults looks for zero values).
func (a *alias) String() string {
	if a.target == nil {
		return ""
	}
	return a.target.String()
}

// Set logs at parse time, before anything has a context; klog's global logger is all there is.
func (a *alias) Set(s string) error {
	klog.Background().Info("Flag is deprecated; use its new name", "flag", "--"+a.old, "newFlag", "--"+a.current)
	return a.target.Set(s)
}

// Retired registers name on fs as a flag that is accepted and does nothing; setting it logs one
// line saying why.
func Retired(fs *flag.FlagSet, name, why string) {
	fs.Var(&retired{name: name, why: why}, name, "Deprecated, no effect: "+why+".")
}

type retired struct {
	name, why, value string
}

func (r *retired) String() string { return r.value }

func (r *retired) Set(s string) error {
	klog.Background().Info("Flag is deprecated and has no effect", "flag", "--"+r.name, "reason", r.why)
	r.value = s
	return nil
}
