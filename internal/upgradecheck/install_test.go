package upgradecheck

import (
	"strings"
	"testing"
)

// TestSupports: a release is judged by its version label; none, or one that is no release number,
// cannot be judged.
func TestSupports(t *testing.T) {
	for _, tc := range []struct {
		version string
		want    Status
	}{
		{"0.1.0", Safe}, {"v0.2.3", Safe}, {"1.0.0-rc.1", Safe}, {"0.1.0+build.5", Safe},
		{"0.0.9", NotSafe},
		{"", Unknown}, {"latest", Unknown}, {"0.1", Unknown}, {"0.-1.0", Unknown},
	} {
		if got, note := supports(tc.version); got != tc.want || note == "" {
			t.Errorf("supports(%q) = %q, %q; want %q and a note", tc.version, got, note, tc.want)
		}
	}
}

// TestCheckManifests: documents in a version the target removes are not safe, each with the
// line that fixes it, the path quoted for a shell where it needs it; other documents and groups
// are left alone; a document that is not YAML cannot be judged.
func TestCheckManifests(t *testing.T) {
	old := "apiVersion: resource.k8s.io/v1beta1\nkind: ResourceClaim\nmetadata:\n  name: a\n"
	for _, tc := range []struct {
		name, path, data, target string
		want                     Status
		fix                      string
	}{
		{name: "v1beta1 at 1.38", path: "m.yaml", data: old, target: "1.38", want: NotSafe, fix: "kubectl dra upgrade -f m.yaml --to v1 --in-place"},
		{name: "v1beta1 at 1.37", path: "m.yaml", data: old, target: "1.37", want: Safe},
		{name: "path with a space", path: "my dir/it's.yaml", data: old, target: "1.38", want: NotSafe, fix: `kubectl dra upgrade -f 'my dir/it'\''s.yaml' --to v1 --in-place`},
		{name: "standard input", path: "-", data: old, target: "1.38", want: NotSafe, fix: "kubectl dra upgrade -f - --to v1"},
		{name: "other group", path: "m.yaml", data: "apiVersion: policy/v1beta1\nkind: PodSecurityPolicy\nmetadata:\n  name: a\n", target: "1.38", want: Safe},
		{name: "not YAML", path: "m.yaml", data: "a: [\n", target: "1.38", want: Unknown, fix: "fix the YAML"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target, err := ParseRelease(tc.target)
			if err != nil {
				t.Fatal(err)
			}
			m := CheckManifests([]Source{{Path: tc.path, Data: []byte(tc.data)}}, target)
			if m.Status != tc.want || m.Documents != 1 {
				t.Fatalf("status %q with %d documents, want %q with 1: %+v", m.Status, m.Documents, tc.want, m.Findings)
			}
			if tc.fix == "" {
				if len(m.Findings) != 0 {
					t.Errorf("findings %+v, want none", m.Findings)
				}
				return
			}
			if len(m.Findings) != 1 || !strings.HasPrefix(m.Findings[0].Fix, tc.fix) {
				t.Errorf("findings %+v, want one fixed by %q", m.Findings, tc.fix)
			}
		})
	}
}
