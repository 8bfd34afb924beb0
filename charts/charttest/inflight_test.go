package charttest

import (
	"strings"
	"testing"
)

// TestWebhookMaxRequestsInFlight: webhook.maxRequestsInFlight reaches the webhook's flag; the
// schema refuses what the flag would (1..4096), naming the value.
func TestWebhookMaxRequestsInFlight(t *testing.T) {
	for _, tc := range []struct {
		name          string
		sets          []string
		want, wantErr string
	}{
		{name: "default", want: "64"},
		{name: "set", sets: []string{"webhook.maxRequestsInFlight=8"}, want: "8"},
		{name: "highest", sets: []string{"webhook.maxRequestsInFlight=4096"}, want: "4096"},
		{name: "zero", sets: []string{"webhook.maxRequestsInFlight=0"}, wantErr: "/webhook/maxRequestsInFlight"},
		{name: "too many", sets: []string{"webhook.maxRequestsInFlight=4097"}, wantErr: "/webhook/maxRequestsInFlight"},
		{name: "negative", sets: []string{"webhook.maxRequestsInFlight=-1"}, wantErr: "/webhook/maxRequestsInFlight"},
		{name: "not a number", sets: []string{"webhook.maxRequestsInFlight=many"}, wantErr: "/webhook/maxRequestsInFlight"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := render(t, capabilities(t, clusters[len(clusters)-1]), values(t, tc.sets...))
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
