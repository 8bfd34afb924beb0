package charttest

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// TestWebhookMaxRequestsInFlight: webhook.maxRequestsInFlight reaches the webhook's flag; the
// schema refuses what the flag would (1..4096), naming the value.
func TestWebhookMaxRequestsInFlight(t *testing.T) {
	for _, tc := range []struct {
		name, set, want, wantErr string
	}{
		{name: "default", want: "--max-requests-in-flight=64"},
		{name: "set", set: "webhook.maxRequestsInFlight=8", want: "--max-requests-in-flight=8"},
		{name: "highest", set: "webhook.maxRequestsInFlight=4096", want: "--max-requests-in-flight=4096"},
		{name: "zero", set: "webhook.maxRequestsInFlight=0", wantErr: "/webhook/maxRequestsInFlight"},
		{name: "too many", set: "webhook.maxRequestsInFlight=4097", wantErr: "/webhook/maxRequestsInFlight"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sets []string
			if tc.set != "" {
				sets = append(sets, tc.set)
			}
			r, err := render(t, capabilities(t, clusters[len(clusters)-1]), values(t, sets...))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("render: %v, want an error naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			m, ok := r.find("Deployment", "gpu-dra-webhook")
			if !ok {
				t.Fatal("no webhook Deployment")
			}
			var dep appsv1.Deployment
			decode(t, m, &dep)
			for _, c := range dep.Spec.Template.Spec.Containers {
				if c.Name == "webhook" && !slices.Contains(c.Command, tc.want) {
					t.Errorf("webhook command %q, want %s", c.Command, tc.want)
				}
			}
		})
	}
}
