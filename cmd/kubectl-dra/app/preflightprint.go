package app

import (
	"fmt"
	"io"
	"strings"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
	"github.com/gpu-dra/gpu-dra/internal/upgradecheck"
)

// textWriter keeps the first write error so the printer reads as a list of lines.
type textWriter struct {
	w   io.Writer
	err error
}

func (t *textWriter) line(format string, args ...any) {
	if t.err == nil {
		_, t.err = fmt.Fprintf(t.w, format+"\n", args...)
	}
}

// section prints a section's heading with its outcome in capitals where it is not safe.
func (t *textWriter) section(title string, s upgradecheck.Status) {
	t.line("")
	t.line("%-44s %s", title, strings.ToUpper(string(s)))
}

func printPreflightText(w io.Writer, rep *upgradecheck.Report) error {
	t := &textWriter{w: w}
	t.line("Upgrade to Kubernetes %s: %s", rep.Target, strings.ToUpper(string(rep.Verdict)))
	if c := rep.Cluster; c != nil {
		printVersions(t, rep.Target, c.Versions)
		printStorage(t, c.Storage)
		printClients(t, c.Clients)
		printInstall(t, c.Install)
	} else if rep.ClusterSkipped != "" {
		t.line("")
		t.line("cluster not checked: %s", rep.ClusterSkipped)
	}
	if m := rep.Manifests; m != nil {
		printManifests(t, m)
	}
	return t.err
}

func versionList(vs []string) string {
	if len(vs) == 0 {
		return "none"
	}
	return strings.Join(vs, ", ")
}

// keptList names the versions target keeps, saying which of them it already deprecates.
func keptList(target string, kept []string) string {
	rel, err := upgradecheck.ParseRelease(target)
	out := make([]string, 0, len(kept))
	for _, v := range kept {
		if l, ok := upgradecheck.LifecycleOf(v); ok && err == nil && l.DeprecatedBy(rel) && l.Removed != nil {
			v += fmt.Sprintf(" (deprecated, only where enabled, gone in %s)", l.Removed)
		}
		out = append(out, v)
	}
	return versionList(out)
}

func printVersions(t *textWriter, target string, v upgradecheck.Versions) {
	t.section(fmt.Sprintf("%s versions (cluster %s)", resourceversion.Group, v.Server), v.Status)
	t.line("  served now:      %s", versionList(v.Served))
	t.line("  %-16s %s", target+" serves:", keptList(target, v.Kept))
	if len(v.Dropped) > 0 {
		t.line("  %-16s %s", "gone in "+target+":", versionList(v.Dropped))
	}
	for _, n := range v.Notes {
		t.line("  note: %s", n)
	}
}

func printStorage(t *textWriter, s upgradecheck.Storage) {
	title := "Stored objects"
	if s.Source != "" {
		title += " (" + s.Source + ")"
	}
	t.section(title, s.Status)
	for _, r := range s.Resources {
		detail := ""
		switch {
		case r.Migration != "":
			detail = "migrated (" + r.Migration + ")"
		case r.Rewrite != "":
			detail = "migrated (" + r.Rewrite + ")"
		case r.Objects > 0 && r.Status == upgradecheck.NotSafe:
			detail = "not migrated"
		case r.Objects > 0 && r.Status == upgradecheck.Unknown:
			detail = "not known to be migrated"
		}
		if r.Encoding != "" {
			detail = strings.TrimPrefix(detail+", written as "+r.Encoding, ", ")
		}
		t.line("%s", strings.TrimRight(fmt.Sprintf("  %-24s %5d  %s", r.Resource, r.Objects, detail), " "))
	}
	printWhyFix(t, s.Reason, s.Fix)
}

func printClients(t *textWriter, c upgradecheck.Clients) {
	t.section("Clients requesting deprecated versions", c.Status)
	for _, r := range c.Requests {
		res := r.Resource
		if r.Subresource != "" {
			res += "/" + r.Subresource
		}
		t.line("  %s %s (removed in %s)", r.Version, res, r.RemovedRelease)
	}
	if len(c.Requests) == 0 && c.Status == upgradecheck.Safe {
		t.line("  none since the API server started")
	}
	printWhyFix(t, c.Reason, "")
}

func printInstall(t *textWriter, in upgradecheck.Install) {
	t.section("gpu-dra installation", in.Status)
	for _, c := range in.Components {
		t.line("  %s %s/%s: release %s, %s, version %s", c.Kind, c.Namespace, c.Name, orNone(c.Release), orNone(c.Chart), orNone(c.Version))
		for _, img := range c.Images {
			t.line("    image %s", img)
		}
		if c.Note != "" {
			t.line("    %s", c.Note)
		}
	}
	if in.Status == upgradecheck.Safe {
		if in.Reason != "" {
			t.line("  note: %s", in.Reason)
		}
		return
	}
	printWhyFix(t, in.Reason, "")
}

func printManifests(t *textWriter, m *upgradecheck.Manifests) {
	docs := "documents"
	if m.Documents == 1 {
		docs = "document"
	}
	t.section(fmt.Sprintf("Manifests (%d %s)", m.Documents, docs), m.Status)
	for _, d := range m.Findings {
		name := d.Name
		if d.Namespace != "" {
			name = d.Namespace + "/" + d.Name
		}
		t.line("  %s document %d: %s %s (%s)", d.File, d.Document, orNone(d.Kind), orNone(name), orNone(d.APIVersion))
		t.line("    %s", d.Problem)
		t.line("    fix: %s", d.Fix)
	}
}

func printWhyFix(t *textWriter, why, fix string) {
	if why != "" {
		t.line("  why: %s", why)
	}
	if fix != "" {
		t.line("  fix: %s", fix)
	}
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
