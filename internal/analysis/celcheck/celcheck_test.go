package celcheck

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

type analyzeCase struct {
	Name           string   `json:"name"`
	Expr           string   `json:"expr"`
	CompileError   string   `json:"compileError"`
	Issues         []string `json:"issues"`
	MentionsDriver bool     `json:"mentionsDriver"`
	NamesDomain    bool     `json:"namesDomain"`
	Opaque         bool     `json:"opaque"`
	Refs           []string `json:"refs"`
}

func loadCases(t *testing.T) []analyzeCase {
	t.Helper()
	data, err := os.ReadFile("testdata/cases.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cases []analyzeCase
	if err := yaml.UnmarshalStrict(data, &cases); err != nil {
		t.Fatalf("testdata/cases.yaml: %v", err)
	}
	return cases
}

func refStrings(refs []Ref) []string {
	var out []string
	for _, r := range refs {
		s := r.Domain + "/" + r.Name
		if r.Capacity {
			s = "cap:" + s
		}
		out = append(out, s)
	}
	return out
}

func TestAnalyze(t *testing.T) {
	for _, tc := range loadCases(t) {
		t.Run(tc.Name, func(t *testing.T) {
			c := New("gpu.example.com", deviceschema.DeviceSchema())
			a := c.Analyze(tc.Expr)
			if tc.CompileError != "" {
				if !strings.Contains(a.CompileError, tc.CompileError) {
					t.Fatalf("compile error\n got: %q\nwant substring: %q", a.CompileError, tc.CompileError)
				}
				return
			}
			if a.CompileError != "" {
				t.Fatalf("unexpected compile error: %s", a.CompileError)
			}
			if got, want := fmt.Sprintf("%q", a.Issues), fmt.Sprintf("%q", tc.Issues); got != want {
				t.Errorf("issues\n got: %s\nwant: %s", got, want)
			}
			if a.MentionsDriver != tc.MentionsDriver || a.NamesDomain != tc.NamesDomain || a.Opaque != tc.Opaque {
				t.Errorf("mentionsDriver/namesDomain/opaque = %t/%t/%t, want %t/%t/%t", a.MentionsDriver, a.NamesDomain, a.Opaque, tc.MentionsDriver, tc.NamesDomain, tc.Opaque)
			}
			if !a.Opaque {
				if got, want := fmt.Sprintf("%q", refStrings(a.Refs)), fmt.Sprintf("%q", tc.Refs); got != want {
					t.Errorf("refs\n got: %s\nwant: %s", got, want)
				}
			}
			// A second call must be served from the cache with the same answer.
			if c.Analyze(tc.Expr) != a {
				t.Errorf("second Analyze did not return the cached analysis")
			}
		})
	}
}
