package charttest

import (
	"strings"
	"testing"
)

// TestWebhookMaxRequestsInFlight: webhook.maxRequestsInFlight reaches the webhook's flag; the
// schema refuses what the flag would (1..4096), naming the value.
func TestWebhookMaxRequestsInFlight(t *testing.T) {
	for _, tc := range []struct {
		name, set, want, wantErr string
	}{
		{name: "default", want: "64"},
		{name: "set", set: "webhook.maxRequestsInFlight=8", want: "8"},
		{name: "highest", set: "webhook.maxRequestsInFlight=4096", want: "4096"},
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
			if got := flagValue(r.webhookContainer(t).Command, "--max-requests-in-flight"); got != tc.want {
				t.Errorf("webhook --max-requests-in-flight=%s, want %s", got, tc.want)
			}
		})
	}
}
