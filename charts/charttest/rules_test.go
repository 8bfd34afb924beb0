package charttest

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation"
)

// readmeDenyRow is the chart README's row for webhook.deny.
var readmeDenyRow = regexp.MustCompile("(?m)^\\| `webhook\\.deny` \\| `\\[\\]` \\| warnings to deny: (.*) \\|$")

// valuesDenyComment is the line values.yaml documents webhook.deny with (what `helm show values`
// prints).
var valuesDenyComment = regexp.MustCompile(`(?m)^  # -- Warnings to turn into denials: (.*)\.\n  deny:`)

// TestDenyRules: the chart offers exactly the rules the webhook knows (claimvalidation.Rules), in
// the values schema, the values comment and the chart's README, and passes them on in a form its --deny accepts.
func TestDenyRules(t *testing.T) {
	want := claimvalidation.RuleNames()
	ch := loadChart(t)

	var schema struct {
		Properties struct {
			Webhook struct {
				Properties struct {
					Deny struct {
						Items struct {
							Enum []string `json:"enum"`
						} `json:"items"`
					} `json:"deny"`
				} `json:"properties"`
			} `json:"webhook"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(ch.Schema, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	if got := schema.Properties.Webhook.Properties.Deny.Items.Enum; !slices.Equal(got, want) {
		t.Errorf("values.schema.json webhook.deny enum = %q, want claimvalidation.Rules %q", got, want)
	}

	for _, doc := range []struct {
		name  string
		files []*common.File
		re    *regexp.Regexp
		quote string
	}{
		{name: "values.yaml", files: ch.Raw, re: valuesDenyComment},
		{name: "README.md", files: ch.Files, re: readmeDenyRow, quote: "`"},
	} {
		i := slices.IndexFunc(doc.files, func(f *common.File) bool { return f.Name == doc.name })
		if i < 0 {
			t.Fatalf("chart has no %s", doc.name)
		}
		m := doc.re.FindSubmatch(doc.files[i].Data)
		if m == nil {
			t.Fatalf("%s: no line matching %q", doc.name, doc.re)
		}
		var got []string
		for _, name := range strings.Split(string(m[1]), ", ") {
			got = append(got, strings.Trim(name, doc.quote))
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s lists the rules %q for webhook.deny, want claimvalidation.Rules %q", doc.name, got, want)
		}
	}

	r := mustRender(t, capabilities(t, clusters[1]), values(t, "webhook.deny={"+strings.Join(want, ",")+"}"))
	dm, ok := r.find("Deployment", "gpu-dra-webhook")
	if !ok {
		t.Fatal("no webhook Deployment")
	}
	var d appsv1.Deployment
	decode(t, dm, &d)
	var args []string
	for _, c := range d.Spec.Template.Spec.Containers {
		args = append(append(args, c.Command...), c.Args...)
	}
	j := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "--deny=") })
	if j < 0 {
		t.Fatalf("webhook.deny set, but the webhook has no --deny: %q", args)
	}
	rules, err := claimvalidation.ParseRules(strings.TrimPrefix(args[j], "--deny="))
	if err != nil {
		t.Fatalf("the webhook refuses the chart's %s: %v", args[j], err)
	}
	if !slices.Equal(rules, claimvalidation.Rules) {
		t.Errorf("the chart passes %q, want %q", rules, claimvalidation.Rules)
	}
}
