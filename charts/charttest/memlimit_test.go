package charttest

import (
	"strings"
	"testing"
)

// TestWebhookGoMemLimit: the webhook's GOMEMLIMIT is goMemLimitPercent of its memory limit, in
// bytes, whatever unit the limit is written in; a limit the chart cannot read fails the render
// naming the value and the way out.
func TestWebhookGoMemLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sets    []string
		want    string // "" for no GOMEMLIMIT
		wantErr string
	}{
		{name: "defaults", want: "120795955"}, // 45 % of 256Mi
		{name: "Gi", sets: []string{"webhook.resources.limits.memory=1Gi", "webhook.goMemLimitPercent=50"}, want: "536870912"},
		{name: "decimal unit", sets: []string{"webhook.resources.limits.memory=1G"}, want: "450000000"},
		{name: "bytes", sets: []string{"webhook.resources.limits.memory=1000000"}, want: "450000"},
		{name: "off", sets: []string{"webhook.goMemLimitPercent=0"}},
		{name: "fraction", sets: []string{"webhook.resources.limits.memory=0.5Gi"}, wantErr: `webhook.resources.limits.memory="0.5Gi"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := render(t, capabilities(t, clusters[len(clusters)-1]), values(t, tc.sets...))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "goMemLimitPercent=0") {
					t.Fatalf("render: %v, want an error naming %s and the way out", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			for _, e := range r.webhookContainer(t).Env {
				if e.Name == "GOMEMLIMIT" {
					got = e.Value
				}
			}
			if got != tc.want {
				t.Errorf("GOMEMLIMIT %q, want %q", got, tc.want)
			}
		})
	}
}
