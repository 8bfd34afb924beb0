package main

import (
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// informerFactory links an informer and a lister of every built-in resource once anything
// creates a factory: 0.9 MB of type data in the webhook binary, every page of it resident while
// the webhook runs (the runtime reads type data throughout), for the one informer of Nodes.
const informerFactory = "k8s.io/client-go/informers"

// goList runs `go list -deps` on the webhook's command with format, a line per package.
func goList(t *testing.T, format string) []string {
	t.Helper()
	// `go test` puts the go command that runs it first on PATH.
	cmd := exec.Command("go", "list", "-deps", "-f", format, ".")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// TestNoInformerFactory: none of the webhook's own packages imports client-go's informer factory.
// (controller-runtime's leader election imports it without creating one, which the linker drops.)
func TestNoInformerFactory(t *testing.T) {
	module := "github.com/gpu-dra/gpu-dra/"
	for _, l := range goList(t, `{{.ImportPath}} {{join .Imports " "}}`) {
		fields := strings.Fields(l)
		if len(fields) > 0 && strings.HasPrefix(fields[0], module) && slices.Contains(fields[1:], informerFactory) {
			t.Errorf("%s imports %s; build the informer from cache.NewSharedIndexInformer and a typed client's List and Watch", fields[0], informerFactory)
		}
	}
}

// TestNoHeapProfiler: nothing the webhook links imports runtime/pprof. A binary that references
// the heap profile has the runtime sample a stack every 512 KiB allocated, from the first
// allocation on, into tables that stay resident (1.5 MiB of an idle webhook); one that does not
// has the linker turn the sampling off. controller-runtime's manager imports net/http/pprof for
// its profiling endpoint, which the webhook does not serve: server.Runner runs its parts instead.
func TestNoHeapProfiler(t *testing.T) {
	deps := goList(t, "{{.ImportPath}}")
	for _, banned := range []string{"runtime/pprof", "net/http/pprof", "sigs.k8s.io/controller-runtime/pkg/manager"} {
		if slices.Contains(deps, banned) {
			t.Errorf("the webhook links %s; `go list -deps -f '{{.ImportPath}} {{.Imports}}' ./cmd/gpu-webhook` shows what imports it", banned)
		}
	}
}
