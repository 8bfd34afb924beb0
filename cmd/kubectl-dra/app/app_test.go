package app

import (
	"bytes"
	"strings"
	"testing"

	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// result is what one invocation of the plugin printed and returned.
type result struct {
	stdout, stderr string
	code           int
}

// run executes `kubectl dra args...` in-process, as main does.
func run(t testing.TB, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := NewCommand(genericiooptions.IOStreams{In: strings.NewReader(stdin), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(args)
	err := cmd.Execute()
	return result{stdout: out.String(), stderr: errOut.String(), code: ExitCode(err)}
}

// noCluster makes sure no kubeconfig of the machine running the tests is used.
func noCluster(t *testing.T) {
	t.Helper()
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
}
