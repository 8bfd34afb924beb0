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

// TestNoInformerFactory: none of the webhook's own packages imports client-go's informer factory.
// (controller-runtime's leader election imports it without creating one, which the linker drops.)
func TestNoInformerFactory(t *testing.T) {
	// `go test` puts the go command that runs it first on PATH.
	cmd := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}} {{join .Imports " "}}`, ".")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	module := "github.com/gpu-dra/gpu-dra/"
	for l := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(l)
		if len(fields) > 0 && strings.HasPrefix(fields[0], module) && slices.Contains(fields[1:], informerFactory) {
			t.Errorf("%s imports %s; build the informer from cache.NewSharedIndexInformer and a typed client's List and Watch", fields[0], informerFactory)
		}
	}
}
