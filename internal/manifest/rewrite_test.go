package manifest

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime/schema"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/convert/golden")

const seedDir = "../../e2e/testdata/seed"

// TestSeed: the seed's 1.32 template becomes its 1.34 template byte for byte, and back.
func TestSeed(t *testing.T) {
	v1beta1 := read(t, filepath.Join(seedDir, "resourceclaimtemplate.v1beta1.yaml"))
	v1 := read(t, filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml"))
	for _, tc := range []struct {
		name     string
		in, want []byte
		to       string
	}{
		{"1.32 to 1.34", v1beta1, v1, "v1"},
		{"1.34 to 1.32", v1, v1beta1, "v1beta1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, changes, err := Rewrite(tc.in, tc.to)
			if err != nil {
				t.Fatal(err)
			}
			if len(changes) != 1 || changes[0].Action != Converted || changes[0].Rendered {
				t.Errorf("changes: %+v", changes)
			}
			if !bytes.Equal(got, tc.want) {
				t.Errorf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

// goldenCase is one input of testdata/convert; every input is converted to every version.
type goldenCase struct {
	file string
	// rendered lists the documents expected to fall back to rendering the converted object.
	rendered []int
}

var goldenCases = []goldenCase{
	{file: "seed-commented.v1beta1.yaml"},
	{file: "first-available.v1beta1.yaml"},
	{file: "all-mode.v1beta1.yaml"},
	{file: "admin-access.v1beta1.yaml"},
	{file: "interleaved.v1beta1.yaml"},
	{file: "claim.v1beta2.yaml"},
	{file: "template.v1beta2.yaml"},
	{file: "deviceclass.v1beta1.yaml"},
	{file: "indented.v1beta1.yaml"},
	{file: "mixed-stream.yaml"},
	{file: "fallback.v1beta1.yaml", rendered: []int{1, 2}},
	{file: "json.v1beta1.json"},
	{file: "crlf.v1beta1.yaml"},
}

func TestConvertGolden(t *testing.T) {
	for _, tc := range goldenCases {
		in := read(t, filepath.Join("testdata/convert", tc.file))
		for _, to := range resourceversion.Known {
			t.Run(tc.file+"/"+to, func(t *testing.T) {
				out, changes, err := Rewrite(in, to)
				if err != nil {
					t.Fatal(err)
				}
				golden(t, filepath.Join("testdata/convert/golden", strings.TrimSuffix(tc.file, ".yaml")+".to-"+to+".yaml"), out)
				golden(t, filepath.Join("testdata/convert/golden", strings.TrimSuffix(tc.file, ".yaml")+".to-"+to+".changes"), summary(changes))
				checkInvariants(t, in, out, changes, to)
				var rendered []int
				for _, c := range changes {
					if c.Rendered {
						rendered = append(rendered, c.Document)
					}
				}
				if to != sourceVersion(t, in) && !reflect.DeepEqual(rendered, tc.rendered) && !(len(rendered) == 0 && len(tc.rendered) == 0) {
					t.Errorf("rendered documents %v, want %v", rendered, tc.rendered)
				}
			})
		}
	}
}

// sourceVersion is the version of the first resource.k8s.io document.
func sourceVersion(t *testing.T, in []byte) string {
	for _, d := range Documents(in) {
		if d.GVK.Group == resourceversion.Group && d.GVK.Kind != resourceversion.KindResourceSlice {
			return d.GVK.Version
		}
	}
	t.Fatal("no resource.k8s.io document")
	return ""
}

var commentRE = regexp.MustCompile(`#.*`)

// checkInvariants: what no conversion may break, whatever the golden files say.
func checkInvariants(t *testing.T, in, out []byte, changes []Change, to string) {
	t.Helper()
	inChunks, outChunks := split(in), split(out)
	if len(inChunks) != len(outChunks) {
		t.Fatalf("%d documents in, %d out", len(inChunks), len(outChunks))
	}
	byDoc := map[int]Change{}
	for _, c := range changes {
		byDoc[c.Document] = c
	}
	for i := range inChunks {
		ic, oc := inChunks[i], outChunks[i]
		if !bytes.Equal(ic.sep, oc.sep) {
			t.Errorf("document %d: separator %q became %q", i+1, ic.sep, oc.sep)
		}
		c, ours := byDoc[i+1]
		if !ours || c.Action != Converted {
			if !bytes.Equal(ic.body, oc.body) {
				t.Errorf("document %d is not converted but changed:\n%s\n->\n%s", i+1, ic.body, oc.body)
			}
			continue
		}
		// The output is what the target version's strict decoder accepts...
		if err := CheckStrict(oc.body); err != nil {
			t.Errorf("document %d: output does not decode strictly: %v\n%s", i+1, err, oc.body)
			continue
		}
		if d := Documents(oc.body); len(d) != 1 || d[0].GVK.Version != to {
			t.Errorf("document %d: output is not resource.k8s.io/%s:\n%s", i+1, to, oc.body)
		}
		// ...and means what the input meant, as the webhook reads both.
		sameMeaning(t, i+1, ic.body, oc.body)
		if !c.Rendered {
			for _, com := range commentRE.FindAll(ic.body, -1) {
				if !bytes.Contains(oc.body, bytes.TrimSpace(com)) {
					t.Errorf("document %d: comment %q lost", i+1, com)
				}
			}
		}
	}
	// Converting again changes nothing.
	again, changes2, err := Rewrite(out, to)
	if err != nil {
		t.Fatalf("second conversion: %v", err)
	}
	if !bytes.Equal(again, out) {
		t.Errorf("second conversion changed the output:\n%s", again)
	}
	for _, c := range changes2 {
		if c.Action != Unchanged && c.Action != Skipped {
			t.Errorf("second conversion: %+v", c)
		}
	}
}

// sameMeaning compares two documents after upgrading both to v1 with the webhook's decoder
// (claims and templates) or the scheme (DeviceClasses).
func sameMeaning(t *testing.T, doc int, a, b []byte) {
	t.Helper()
	ja, err := sigsyaml.YAMLToJSON(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := sigsyaml.YAMLToJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	d := Documents(a)[0]
	if d.GVK.Kind == resourceversion.KindDeviceClass {
		oa, _, err := resourceversion.DecodeStrict(ja)
		if err != nil {
			t.Fatal(err)
		}
		ob, _, err := resourceversion.DecodeStrict(jb)
		if err != nil {
			t.Fatal(err)
		}
		va, _ := resourceversion.To(oa, "v1")
		vb, _ := resourceversion.To(ob, "v1")
		if !equality.Semantic.DeepEqual(va, vb) {
			t.Errorf("document %d: DeviceClass changed meaning:\n%+v\n%+v", doc, va, vb)
		}
		return
	}
	ua, err := resourceversion.Decode(ja, schema.GroupVersionKind{})
	if err != nil {
		t.Fatalf("document %d: webhook decoder: %v", doc, err)
	}
	ub, err := resourceversion.Decode(jb, schema.GroupVersionKind{})
	if err != nil {
		t.Fatalf("document %d: webhook decoder on the output: %v", doc, err)
	}
	if !equality.Semantic.DeepEqual(ua.Spec(), ub.Spec()) || ua.Name() != ub.Name() || ua.Namespace() != ub.Namespace() {
		t.Errorf("document %d changed meaning:\n in: %s\nout: %s", doc, ua.V1Form(), ub.V1Form())
	}
	if ua.Template != nil && !equality.Semantic.DeepEqual(ua.Template.Spec.ObjectMeta, ub.Template.Spec.ObjectMeta) {
		t.Errorf("document %d: template metadata changed", doc)
	}
}

// TestRoundTrip: to every version and back to where it came from means the same.
func TestRoundTrip(t *testing.T) {
	for _, tc := range goldenCases {
		in := read(t, filepath.Join("testdata/convert", tc.file))
		from := sourceVersion(t, in)
		for _, via := range resourceversion.Known {
			t.Run(tc.file+"/via-"+via, func(t *testing.T) {
				mid, _, err := Rewrite(in, via)
				if err != nil {
					t.Fatal(err)
				}
				back, _, err := Rewrite(mid, from)
				if err != nil {
					t.Fatal(err)
				}
				inDocs, backDocs := Documents(in), Documents(back)
				for i := range inDocs {
					if inDocs[i].GVK.Group != resourceversion.Group || inDocs[i].GVK.Kind == resourceversion.KindResourceSlice || inDocs[i].GVK.Version != from {
						continue
					}
					sameMeaning(t, inDocs[i].Index, inDocs[i].Raw, backDocs[i].Raw)
				}
			})
		}
	}
}

func TestConvertErrors(t *testing.T) {
	for _, tc := range []struct {
		name, file, to string
		want           string
	}{
		{name: "v1beta1 layout under v1", file: "unknown-field.v1.yaml", to: "v1", want: `unknown field "spec.spec.devices.requests[0].deviceClassName"`},
		{name: "v1beta1 layout under v1, other target", file: "unknown-field.v1.yaml", to: "v1beta1", want: `unknown field "spec.spec.devices.requests[0].deviceClassName"`},
		{name: "bad target", file: "claim.v1beta2.yaml", to: "v2", want: `target version "v2"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := read(t, filepath.Join("testdata/convert", tc.file))
			out, _, err := Rewrite(in, tc.to)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %s", err, tc.want)
			}
			if out != nil && !bytes.Equal(out, in) {
				t.Errorf("failed document changed:\n%s", out)
			}
		})
	}
}

func TestSplitJoin(t *testing.T) {
	for _, in := range []string{
		"", "a: 1", "a: 1\n", "---\na: 1\n---\nb: 2", "a: |\n  ---\n  x\n", "--- # c\n\n---\n", "----\na: 1\n", "a: 1\r\n---\r\nb: 2\r\n",
	} {
		if got := string(join(split([]byte(in)))); got != in {
			t.Errorf("split/join %q = %q", in, got)
		}
	}
	if n := len(split([]byte("a: |\n  ---\n  x\n---\nb: 1\n"))); n != 2 {
		t.Errorf("indented --- inside a block scalar split the document: %d chunks", n)
	}
}

func summary(changes []Change) []byte {
	var b bytes.Buffer
	for _, c := range changes {
		fmt.Fprintf(&b, "document %d: %s %s %s/%s %s -> %s rendered=%t\n", c.Document, c.Action, c.Kind, c.Namespace, c.Name, c.From, c.To, c.Rendered)
	}
	return b.Bytes()
}

func read(t testing.TB, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	path += ".golden"
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -update rewrites it):\n got:\n%s\nwant:\n%s", path, got, want)
	}
}
