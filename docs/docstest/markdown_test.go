package docstest

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// mdFile is one Markdown file of the documentation, read once.
type mdFile struct {
	// path is relative to the repository root, with slashes.
	path  string
	lines []string
	// fenced marks the lines inside a fenced code block (fences included).
	fenced []bool
}

// repoRoot is the module's root: the nearest directory above the test's with a go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// docFiles reads README.md and every Markdown file under docs/.
func docFiles(t *testing.T, root string) []*mdFile {
	t.Helper()
	paths := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			paths = append(paths, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk docs/: %v", err)
	}
	var out []*mdFile
	for _, p := range paths {
		f, err := readMarkdown(root, p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

var fence = regexp.MustCompile("^\\s*(```|~~~)")

func readMarkdown(root, path string) (*mdFile, error) {
	raw, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(path)))
	if err != nil {
		return nil, err
	}
	f := &mdFile{path: path, lines: strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")}
	in := false
	for _, l := range f.lines {
		isFence := fence.MatchString(l)
		f.fenced = append(f.fenced, in || isFence)
		if isFence {
			in = !in
		}
	}
	return f, nil
}

var codeSpan = regexp.MustCompile("`+[^`]*`+")

// prose is line i without its inline code, blanked so that positions stay; "" inside code blocks.
func (f *mdFile) prose(i int) string {
	if f.fenced[i] {
		return ""
	}
	return codeSpan.ReplaceAllStringFunc(f.lines[i], func(s string) string { return strings.Repeat(" ", len(s)) })
}

// code is what line i shows as code: the whole line in a code block, else its inline code spans.
func (f *mdFile) code(i int) []string {
	if f.fenced[i] {
		return []string{f.lines[i]}
	}
	var out []string
	for _, s := range codeSpan.FindAllString(f.lines[i], -1) {
		out = append(out, strings.Trim(s, "` "))
	}
	return out
}

var (
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refLink    = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
)

// link is one link target as written, and where.
type link struct {
	line   int
	target string
}

// links lists the targets of the inline and reference links outside code.
func (f *mdFile) links() []link {
	var out []link
	for i := range f.lines {
		p := f.prose(i)
		for _, m := range inlineLink.FindAllStringSubmatch(p, -1) {
			out = append(out, link{line: i + 1, target: m[1]})
		}
		if m := refLink.FindStringSubmatch(p); m != nil {
			out = append(out, link{line: i + 1, target: m[1]})
		}
	}
	return out
}

var (
	heading     = regexp.MustCompile(`^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$`)
	htmlAnchor  = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	mdLinkInner = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// anchors are the fragment names GitHub gives f's headings (and explicit <a id> anchors).
func (f *mdFile) anchors() map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for i, l := range f.lines {
		if f.fenced[i] {
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			out[m[1]] = true
		}
		m := heading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			out[s+"-"+itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// slug is GitHub's anchor for a heading: the rendered text lowercased, every character but
// letters, digits, marks, spaces, hyphens and underscores dropped, spaces made hyphens.
func slug(text string) string {
	text = mdLinkInner.ReplaceAllString(text, "$1")
	text = strings.NewReplacer("`", "", "*", "").Replace(text)
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + itoa(n%10)
}
