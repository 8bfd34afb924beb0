// Package flagalias keeps a renamed flag's old name working for a while: setting the old name
// sets the new flag and logs one line saying it is deprecated, so that a rollout mixing the old
// chart with a new binary (or the other way round) still starts.
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
