package app

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

const seedDir = "../../../e2e/testdata/seed"

func TestUpgradeSeedFromStdin(t *testing.T) {
	noCluster(t)
	in := readText(t, filepath.Join(seedDir, "resourceclaimtemplate.v1beta1.yaml"))
	want := readText(t, filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml"))
	r := run(t, in, "upgrade", "-f", "-", "--to", "v1")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if r.stdout != want {
		t.Errorf("stdout:\n%s\nwant the seed's v1 template:\n%s", r.stdout, want)
	}
	if wantLine := "upgraded ResourceClaimTemplate default/example resource.k8s.io/v1beta1 → v1 (document 1)\n"; r.stderr != wantLine {
		t.Errorf("stderr %q, want %q", r.stderr, wantLine)
	}
}

// TestUpgradeGolden runs the plugin over a directory: several files, a stream mixing Pods,
// Deployments and resource.k8s.io objects, every target version.
func TestUpgradeGolden(t *testing.T) {
	noCluster(t)
	for _, to := range []string{"v1", "v1beta2", "v1beta1"} {
		t.Run(to, func(t *testing.T) {
			r := run(t, "", "upgrade", "-f", "testdata/upgrade", "--to", to)
			if r.code != 0 {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			golden(t, "testdata/upgrade/golden/to-"+to+".stdout", r.stdout)
			golden(t, "testdata/upgrade/golden/to-"+to+".stderr", r.stderr)
			// The Pod file comes out as it went in.
			if pod := readText(t, "testdata/upgrade/pod.yaml"); !strings.Contains(r.stdout, pod) {
				t.Errorf("pod.yaml not passed through byte for byte")
			}
		})
	}
}

func TestUpgradeDefaultTargetWithoutCluster(t *testing.T) {
	noCluster(t)
	r := run(t, readText(t, "testdata/upgrade/claim.yaml"), "upgrade", "-f", "-")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "no reachable cluster") || !strings.Contains(r.stdout, "apiVersion: resource.k8s.io/v1\n") {
		t.Errorf("want a v1 conversion with a note:\nstdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	}
}

func TestUpgradeInPlace(t *testing.T) {
	noCluster(t)
	dir := t.TempDir()
	files := []string{"bundle.yaml", "claim.yaml", "pod.yaml"}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(readText(t, "testdata/upgrade/"+f)), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	r := run(t, "", "upgrade", "-f", dir, "--to", "v1", "--in-place")
	if r.code != 0 || r.stdout != "" {
		t.Fatalf("exit %d, stdout %q: %s", r.code, r.stdout, r.stderr)
	}
	printed := run(t, "", "upgrade", "-f", "testdata/upgrade", "--to", "v1")
	var joined []string
	for _, f := range files {
		got := readText(t, filepath.Join(dir, f))
		joined = append(joined, got)
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o640 {
			t.Errorf("%s: mode %v, want 0640 kept", f, st.Mode().Perm())
		}
	}
	if pod := readText(t, filepath.Join(dir, "pod.yaml")); pod != readText(t, "testdata/upgrade/pod.yaml") {
		t.Errorf("pod.yaml changed:\n%s", pod)
	}
	// In place writes what the plugin prints.
	if got := strings.Join(joined, "---\n"); got != printed.stdout {
		t.Errorf("in-place files differ from printed output:\n%s\nvs\n%s", got, printed.stdout)
	}
	again := run(t, "", "upgrade", "-f", dir, "--to", "v1", "--in-place")
	if again.code != 0 || strings.Contains(again.stderr, "upgraded") {
		t.Errorf("second run: exit %d\n%s", again.code, again.stderr)
	}
}

// TestUpgradeInPlaceSymlink rewrites a manifest reached through a symbolic link, named directly and
// found in a directory, and the file itself: the link stays a link, the file it points to is
// converted and keeps its mode and owner.
func TestUpgradeInPlaceSymlink(t *testing.T) {
	noCluster(t)
	for _, tc := range []struct {
		name string
		arg  func(dir string) string
	}{
		{name: "link named with -f", arg: func(dir string) string { return filepath.Join(dir, "links", "claim.yaml") }},
		{name: "link in a directory", arg: func(dir string) string { return filepath.Join(dir, "links") }},
		{name: "the file itself", arg: func(dir string) string { return filepath.Join(dir, "real", "claim.yaml") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, d := range []string{"real", "links"} {
				if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			target := filepath.Join(dir, "real", "claim.yaml")
			link := filepath.Join(dir, "links", "claim.yaml")
			if err := os.WriteFile(target, []byte(readText(t, "testdata/upgrade/claim.yaml")), 0o604); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("../real/claim.yaml", link); err != nil {
				t.Fatal(err)
			}
			// Root rewriting another user's file must give it back to that user.
			owner := os.Getuid()
			if owner == 0 {
				owner = 4242
				if err := os.Chown(target, owner, owner); err != nil {
					t.Fatal(err)
				}
			}

			r := run(t, "", "upgrade", "-f", tc.arg(dir), "--to", "v1", "--in-place")
			if r.code != 0 || !strings.Contains(r.stderr, "upgraded ResourceClaim") {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			if dest, err := os.Readlink(link); err != nil || dest != "../real/claim.yaml" {
				t.Errorf("the link was replaced: readlink = %q, %v", dest, err)
			}
			printed := run(t, readText(t, "testdata/upgrade/claim.yaml"), "upgrade", "-f", "-", "--to", "v1")
			if got := readText(t, target); got != printed.stdout {
				t.Errorf("target not converted:\n%s\nwant:\n%s", got, printed.stdout)
			}
			st, err := os.Stat(target)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o604 {
				t.Errorf("target mode %v, want 0604 kept", st.Mode().Perm())
			}
			if sys := st.Sys().(*syscall.Stat_t); int(sys.Uid) != owner || (os.Getuid() == 0 && int(sys.Gid) != owner) {
				t.Errorf("target owner %d:%d, want %d kept", sys.Uid, sys.Gid, owner)
			}
			if entries, _ := os.ReadDir(filepath.Join(dir, "links")); len(entries) != 1 {
				t.Errorf("links/ holds %d entries, want only the link (no temporary file left)", len(entries))
			}
		})
	}
}

func TestUpgradeErrors(t *testing.T) {
	noCluster(t)
	half := readText(t, "testdata/validate/half-upgraded.v1.yaml")
	for _, tc := range []struct {
		name   string
		stdin  string
		args   []string
		code   int
		stderr string
		stdout string
	}{
		{name: "unknown field", stdin: half, args: []string{"upgrade", "-f", "-", "--to", "v1"}, code: ExitFailed,
			stderr: `unknown field "spec.spec.devices.requests[0].deviceClassName"`, stdout: half},
		{name: "bad target", args: []string{"upgrade", "-f", "testdata/upgrade", "--to", "v2"}, code: ExitFailed, stderr: `--to "v2": use one of v1, v1beta2, v1beta1`},
		{name: "in place on stdin", args: []string{"upgrade", "-f", "-", "--in-place", "--to", "v1"}, code: ExitFailed, stderr: "--in-place: cannot rewrite standard input"},
		{name: "no input", args: []string{"upgrade", "--to", "v1"}, code: ExitFailed, stderr: "-f: required"},
		{name: "missing file", args: []string{"upgrade", "-f", "testdata/nope.yaml", "--to", "v1"}, code: ExitFailed, stderr: "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, tc.stdin, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.stderr) {
				t.Errorf("exit %d, stderr:\n%s\nwant exit %d and %q", r.code, r.stderr, tc.code, tc.stderr)
			}
			if tc.stdout != "" && r.stdout != tc.stdout {
				t.Errorf("stdout:\n%s\nwant the input unchanged", r.stdout)
			}
		})
	}
}

// TestUpgradeTargetFromCluster: without --to, the target is the newest version the cluster of
// the kubeconfig serves: v1beta1 on a 1.32-like server, v1 on a 1.34 one.
func TestUpgradeTargetFromCluster(t *testing.T) {
	v1 := readText(t, filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml"))
	v1beta1 := readText(t, filepath.Join(seedDir, "resourceclaimtemplate.v1beta1.yaml"))
	for _, tc := range []struct {
		name, runtimeConfig string
		in, want            string
	}{
		{name: "1.32-like", runtimeConfig: testapiserver.V1Beta1Only, in: v1, want: v1beta1},
		{name: "all versions", runtimeConfig: testapiserver.AllVersions, in: v1beta1, want: v1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testapiserver.Start(t, testapiserver.WithRuntimeConfig(tc.runtimeConfig))
			kubeconfig := writeKubeconfig(t, srv.Config)
			r := run(t, tc.in, "upgrade", "-f", "-", "--kubeconfig", kubeconfig)
			if r.code != 0 {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			if r.stdout != tc.want {
				t.Errorf("stdout:\n%s\nwant:\n%s\nstderr: %s", r.stdout, tc.want, r.stderr)
			}
		})
	}
}

func readText(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func golden(t *testing.T, path, got string) {
	t.Helper()
	path += ".golden"
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -update creates it)", err)
	}
	if !bytes.Equal([]byte(got), want) {
		t.Errorf("%s differs (go test -update rewrites it):\n got:\n%s\nwant:\n%s", path, got, want)
	}
}
