package app

import (
	"regexp"
	"strings"
	"testing"

	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// TestRootHelpNamesEveryCommand keeps the description `kubectl dra --help` opens with from naming
// fewer commands than the plugin has: cobra's "Available Commands" comes after it, but the
// description is what a reader takes in first.
func TestRootHelpNamesEveryCommand(t *testing.T) {
	noCluster(t)
	help := run(t, "", "--help")
	if help.code != 0 {
		t.Fatalf("kubectl dra --help: exit %d, stderr %q", help.code, help.stderr)
	}
	description, _, found := strings.Cut(help.stdout, "\nUsage:")
	if !found {
		t.Fatalf("kubectl dra --help printed no Usage section:\n%s", help.stdout)
	}
	root := NewCommand(genericiooptions.NewTestIOStreamsDiscard())
	for _, c := range root.Commands() {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			continue
		}
		entry := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(c.Name()) + `\s`)
		if !entry.MatchString(description) {
			t.Errorf("the description kubectl dra --help opens with does not list the command %q:\n%s", c.Name(), description)
		}
	}
}
