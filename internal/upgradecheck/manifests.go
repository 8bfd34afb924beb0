package upgradecheck

import (
	"fmt"
	"strings"

	"github.com/gpu-dra/gpu-dra/internal/manifest"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// Source is one manifest input: a file, or standard input (Path "-").
type Source struct {
	Path string
	Data []byte
}

// CheckManifests finds the documents of sources written in a resource.k8s.io version target no
// longer serves, each with the command that rewrites it.
func CheckManifests(sources []Source, target Release) *Manifests {
	m := &Manifests{Status: Safe}
	to := Kept(target)[0] // v1 never ends, so there is always one
	for _, s := range sources {
		for _, d := range manifest.Documents(s.Data) {
			m.Documents++
			doc := Document{File: s.Path, Document: d.Index, APIVersion: d.GVK.GroupVersion().String(), Kind: d.GVK.Kind, Namespace: d.Namespace, Name: d.Name}
			if d.Err != nil {
				doc.Problem = d.Err.Error()
				doc.Fix = "fix the YAML, then run kubectl dra preflight again"
				m.Findings = append(m.Findings, doc)
				m.Status = worst(m.Status, Unknown)
				continue
			}
			if d.GVK.Group != resourceversion.Group {
				continue
			}
			l, ok := LifecycleOf(d.GVK.Version)
			if !ok || !l.RemovedBy(target) {
				continue
			}
			doc.Problem = fmt.Sprintf("Kubernetes %s does not serve %s (removed in %s)", target, doc.APIVersion, l.Removed)
			doc.Fix = upgradeLine(s.Path, d.GVK.Kind, to)
			m.Findings = append(m.Findings, doc)
			m.Status = NotSafe
		}
	}
	return m
}

// upgradeLine is the command that rewrites the document, or what to do where kubectl dra upgrade
// does not convert the kind.
func upgradeLine(path, kind, to string) string {
	switch kind {
	case resourceversion.KindClaim, resourceversion.KindTemplate, resourceversion.KindDeviceClass:
		if path == "-" {
			return fmt.Sprintf("kubectl dra upgrade -f - --to %s", to)
		}
		return fmt.Sprintf("kubectl dra upgrade -f %s --to %s --in-place", shellQuote(path), to)
	}
	return fmt.Sprintf("rewrite it as %s/%s by hand (kubectl dra upgrade converts ResourceClaims, ResourceClaimTemplates and DeviceClasses only)", resourceversion.Group, to)
}

// shellQuote makes a path safe to paste into a shell: as is when it holds only ordinary
// characters, else in single quotes.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=+@%,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
