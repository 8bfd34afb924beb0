// Package cliflag holds the flag conventions both daemons share, so that their command lines read
// alike: lists are comma-separated and a later use of the flag replaces the list, and a bind
// address of "0" turns its endpoint off (controller-runtime's convention).
package cliflag

import (
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// PodNamespace is the default of a flag naming the daemon's own namespace: $POD_NAMESPACE, which
// the chart sets from the downward API; empty without it, so that Validate asks for the flag
// instead of the daemon guessing a namespace.
func PodNamespace() string { return os.Getenv("POD_NAMESPACE") }

// Disabled is the bind address that turns an endpoint off.
const Disabled = "0"

// List registers a comma-separated list flag on fs. Each use replaces the list: set gets the
// items of the last use, trimmed, without empty ones (so "a, b," is [a b] and "" is none).
func List(fs *flag.FlagSet, name, usage string, set func(items []string) error) {
	fs.Func(name, usage, func(s string) error { return set(Split(s)) })
}

// Split splits a comma-separated list, trims each item and drops empty ones.
func Split(s string) []string {
	var items []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	return items
}

// ValidateBindAddress checks addr, the value of the bind-address flag name: host:port, :port,
// or "0".
func ValidateBindAddress(name, addr string) error {
	if addr == Disabled {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		if n, perr := strconv.Atoi(port); perr != nil || n < 0 || n > 65535 {
			err = fmt.Errorf("port %q is not a number in 0..65535", port)
		}
	}
	if err != nil {
		return fmt.Errorf("%s=%q: %w; use host:port or :port, e.g. :8080, or %s to disable", name, addr, err, Disabled)
	}
	return nil
}
