package docstest

import (
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// maxReadmeLines keeps README.md a front page: what the project is, the two commands, a short tour
// and links. Everything else belongs in docs/.
const maxReadmeLines = 200

func TestReadmeIsShort(t *testing.T) {
	f, err := readMarkdown(repoRoot(t), "README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(f.lines); n > maxReadmeLines {
		t.Errorf("README.md has %d lines, more than %d: move the detail into a page under docs/ and link it", n, maxReadmeLines)
	}
}

// TestRelativeLinks: every link from README.md and docs/ to a file of the repository names one
// that exists, and a #fragment names a heading of the Markdown file it points into.
func TestRelativeLinks(t *testing.T) {
	root := repoRoot(t)
	files := docFiles(t, root)
	anchors := map[string]map[string]bool{}
	for _, f := range files {
		anchors[f.path] = f.anchors()
	}
	for _, f := range files {
		for _, l := range f.links() {
			if msg := checkLink(root, f.path, l.target, anchors); msg != "" {
				t.Errorf("%s:%d: link %q: %s", f.path, l.line, l.target, msg)
			}
		}
	}
}

var scheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)

// checkLink returns what is wrong with target, a link in the file from (repository-relative), or "".
func checkLink(root, from, target string, anchors map[string]map[string]bool) string {
	if scheme.MatchString(target) || strings.HasPrefix(target, "//") {
		return "" // another site: not this test's to check
	}
	rawPath, fragment, _ := strings.Cut(target, "#")
	p, err := url.PathUnescape(rawPath)
	if err != nil {
		return "path does not unescape: " + err.Error()
	}
	dest := from
	if p != "" {
		if strings.HasPrefix(p, "/") {
			return "absolute path; write it relative to " + from
		}
		dest = path.Clean(path.Join(path.Dir(from), p))
		if dest == ".." || strings.HasPrefix(dest, "../") {
			return "points outside the repository"
		}
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(dest))); err != nil {
			return "no such file or directory " + dest
		}
	}
	if fragment == "" || !strings.HasSuffix(dest, ".md") {
		return ""
	}
	a, ok := anchors[dest]
	if !ok {
		f, err := readMarkdown(root, dest)
		if err != nil {
			return err.Error()
		}
		a = f.anchors()
		anchors[dest] = a
	}
	if !a[fragment] {
		return "no heading in " + dest + " has the anchor #" + fragment + "; it has: " + strings.Join(sortedKeys(a), ", ")
	}
	return ""
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var (
	makeTarget     = regexp.MustCompile(`(?m)^([A-Za-z0-9][A-Za-z0-9_.-]*)\s*:([^=]|$)`)
	makeInvocation = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])make\s+([a-z0-9][a-z0-9-]*)`)
)

// TestMakeTargetsExist: every `make TARGET` shown as code in README.md and docs/ is a target of the
// Makefile. (Prose such as "make sure" is not code and not checked.)
func TestMakeTargetsExist(t *testing.T) {
	root := repoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range makeTarget.FindAllStringSubmatch(string(raw), -1) {
		targets[m[1]] = true
	}
	if !targets["demo"] || !targets["test"] {
		t.Fatalf("found no demo and test targets in the Makefile; the parser is wrong: %v", sortedKeys(targets))
	}
	named := 0
	for _, f := range docFiles(t, root) {
		for i := range f.lines {
			for _, c := range f.code(i) {
				for _, m := range makeInvocation.FindAllStringSubmatch(c, -1) {
					named++
					if !targets[m[1]] {
						t.Errorf("%s:%d: `make %s`: the Makefile has no target %q", f.path, i+1, m[1], m[1])
					}
				}
			}
		}
	}
	if named == 0 {
		t.Error("README.md and docs/ name no `make` target at all; the parser is wrong")
	}
}

// workItem matches references to the project's internal planning (an issue, stop or session
// followed by its number), which mean nothing to a reader of the documentation.
var workItem = regexp.MustCompile(`(?i)\b(stop|session|issue)s? [0-9]|\bseed note\b`)

func TestNoWorkItemNumbers(t *testing.T) {
	for _, f := range docFiles(t, repoRoot(t)) {
		for i, l := range f.lines {
			if m := workItem.FindString(l); m != "" {
				t.Errorf("%s:%d: %q names an internal work item; say what changed for the reader instead", f.path, i+1, m)
			}
		}
	}
}

// modulePath matches a path of this repository written as code: a package or a file.
var modulePath = regexp.MustCompile(`^(cmd|driver|webhook|internal|certs|charts|e2e|hack|docs)(/[A-Za-z0-9_.-]+)*/?$`)

var exported = regexp.MustCompile(`^(.+)\.[A-Z][A-Za-z0-9_]*$`)

// TestModulePathsExist: a package or file named as code in README.md and docs/ exists, so that a
// package move cannot leave the documentation pointing at the old place. `pkg.Name` counts as pkg.
func TestModulePathsExist(t *testing.T) {
	root := repoRoot(t)
	exists := func(p string) bool {
		_, err := os.Stat(filepath.Join(root, filepath.FromSlash(p)))
		return err == nil
	}
	for _, f := range docFiles(t, root) {
		for i := range f.lines {
			if f.fenced[i] {
				continue
			}
			for _, c := range f.code(i) {
				if !modulePath.MatchString(c) || exists(c) {
					continue
				}
				if m := exported.FindStringSubmatch(c); m != nil && exists(m[1]) {
					continue
				}
				t.Errorf("%s:%d: `%s` is not a path of this repository", f.path, i+1, c)
			}
		}
	}
}
