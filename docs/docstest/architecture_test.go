package docstest

import (
	"bytes"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
)

const (
	architecture  = "docs/architecture.md"
	mapBegin      = "<!-- package map: checked by docs/docstest -->"
	mapEnd        = "<!-- end of package map -->"
	kubectlDra    = "cmd/kubectl-dra"
	webhookPrefix = "webhook/"
)

// goList runs `go list` in the repository with args and returns its output lines.
func goList(t *testing.T, root string, args ...string) []string {
	t.Helper()
	// `go test` puts the go command that runs it first on PATH.
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// importGraph is every package of the module with non-test code and the packages of the module
// it imports (tests excluded), all relative to the module path.
func importGraph(t *testing.T, root string) map[string][]string {
	t.Helper()
	module := goList(t, root, "-m")[0]
	graph := map[string][]string{}
	for _, l := range goList(t, root, "-f", `{{if .GoFiles}}{{.ImportPath}} {{join .Imports " "}}{{end}}`, "./...") {
		fields := strings.Fields(l)
		if len(fields) == 0 {
			continue
		}
		pkg := strings.TrimPrefix(fields[0], module+"/")
		graph[pkg] = []string{}
		for _, imp := range fields[1:] {
			if rel, ok := strings.CutPrefix(imp, module+"/"); ok {
				graph[pkg] = append(graph[pkg], rel)
			}
		}
		sort.Strings(graph[pkg])
	}
	return graph
}

var codeToken = regexp.MustCompile("`([^`]+)`")

// packageMap reads the table of docs/architecture.md between its markers: package → imports.
func packageMap(t *testing.T, root string) map[string][]string {
	t.Helper()
	f, err := readMarkdown(root, architecture)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	in := false
	for i, l := range f.lines {
		switch {
		case strings.TrimSpace(l) == mapBegin:
			in = true
			continue
		case strings.TrimSpace(l) == mapEnd:
			in = false
		}
		if !in || !strings.HasPrefix(l, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(l), "|"), "|")
		if len(cells) != 3 {
			t.Fatalf("%s:%d: a package map row has three cells (package, job, imports), this one %d", architecture, i+1, len(cells))
		}
		pkg := codeToken.FindStringSubmatch(cells[0])
		if pkg == nil {
			t.Fatalf("%s:%d: the first cell names no package as code", architecture, i+1)
		}
		imports := []string{}
		for _, m := range codeToken.FindAllStringSubmatch(cells[2], -1) {
			imports = append(imports, m[1])
		}
		sort.Strings(imports)
		rows[pkg[1]] = imports
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no package map between %q and %q", architecture, mapBegin, mapEnd)
	}
	return rows
}

// TestPackageMap: the package map of docs/architecture.md lists every package of the module with
// its imports in the module, as the code has them.
func TestPackageMap(t *testing.T) {
	root := repoRoot(t)
	graph, documented := importGraph(t, root), packageMap(t, root)
	for _, pkg := range sortedKeys(setOf(graph)) {
		want := importsCell(graph[pkg])
		got, ok := documented[pkg]
		switch {
		case !ok:
			t.Errorf("%s: package %s is missing; add the row | `%s` | <its job> | %s |", architecture, pkg, pkg, want)
		case importsCell(got) != want:
			t.Errorf("%s: package %s imports %s, the map says %s", architecture, pkg, want, importsCell(got))
		}
	}
	for pkg := range documented {
		if _, ok := graph[pkg]; !ok {
			t.Errorf("%s: package %s is not a package of the module (moved or deleted?); remove or rename its row", architecture, pkg)
		}
	}
}

func setOf(m map[string][]string) map[string]bool {
	out := map[string]bool{}
	for k := range m {
		out[k] = true
	}
	return out
}

// importsCell is the imports cell of a package map row.
func importsCell(imports []string) string {
	if len(imports) == 0 {
		return "—"
	}
	quoted := make([]string, len(imports))
	for i, imp := range imports {
		quoted[i] = fmt.Sprintf("`%s`", imp)
	}
	return strings.Join(quoted, ", ")
}

// TestKubectlDraImportsNoWebhook keeps what docs/architecture.md promises: kubectl dra shares the
// claim analysis with the webhook through internal/analysis, and imports nothing of the webhook's
// admission side, not even indirectly.
func TestKubectlDraImportsNoWebhook(t *testing.T) {
	root := repoRoot(t)
	module := goList(t, root, "-m")[0]
	for _, dep := range goList(t, root, "-deps", "-f", "{{.ImportPath}}", "./"+kubectlDra) {
		if strings.HasPrefix(dep, module+"/"+webhookPrefix) {
			t.Errorf("%s imports %s (directly or through another package); the claim analysis it needs belongs under internal/analysis", kubectlDra, strings.TrimPrefix(dep, module+"/"))
		}
	}
}
