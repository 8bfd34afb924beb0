package charttest

import (
	"strings"
	"testing"
)

// TestWebhookLimits: webhook.maxRequestsInFlight, webhook.maxConnections and
// webhook.maxHandshakesPerSecond reach the webhook's flags; the schema refuses what the flags
// would (1..4096; 0..65536; 1..10000), naming the value.
func TestWebhookLimits(t *testing.T) {
	for _, tc := range []struct {
		name          string
		sets          []string
		flag          string
		want, wantErr string
	}{
		{name: "requests default", flag: "--max-requests-in-flight", want: "64"},
		{name: "requests set", sets: []string{"webhook.maxRequestsInFlight=8"}, flag: "--max-requests-in-flight", want: "8"},
		{name: "requests highest", sets: []string{"webhook.maxRequestsInFlight=4096"}, flag: "--max-requests-in-flight", want: "4096"},
		{name: "requests zero", sets: []string{"webhook.maxRequestsInFlight=0"}, wantErr: "/webhook/maxRequestsInFlight"},
		{name: "requests too many", sets: []string{"webhook.maxRequestsInFlight=4097"}, wantErr: "/webhook/maxRequestsInFlight"},
		{name: "requests negative", sets: []string{"webhook.maxRequestsInFlight=-1"}, wantErr: "/webhook/maxRequestsInFlight"},
		{name: "requests not a number", sets: []string{"webhook.maxRequestsInFlight=many"}, wantErr: "/webhook/maxRequestsInFlight"},
		{name: "connections default", flag: "--max-connections", want: "0"},
		{name: "connections set", sets: []string{"webhook.maxConnections=128"}, flag: "--max-connections", want: "128"},
		{name: "connections highest", sets: []string{"webhook.maxConnections=65536"}, flag: "--max-connections", want: "65536"},
		{name: "connections too many", sets: []string{"webhook.maxConnections=65537"}, wantErr: "/webhook/maxConnections"},
		{name: "connections negative", sets: []string{"webhook.maxConnections=-1"}, wantErr: "/webhook/maxConnections"},
		{name: "connections not a number", sets: []string{"webhook.maxConnections=many"}, wantErr: "/webhook/maxConnections"},
		{name: "handshakes default", flag: "--max-handshakes-per-second", want: "50"},
		{name: "handshakes set", sets: []string{"webhook.maxHandshakesPerSecond=5"}, flag: "--max-handshakes-per-second", want: "5"},
		{name: "handshakes highest", sets: []string{"webhook.maxHandshakesPerSecond=10000"}, flag: "--max-handshakes-per-second", want: "10000"},
		{name: "handshakes zero", sets: []string{"webhook.maxHandshakesPerSecond=0"}, wantErr: "/webhook/maxHandshakesPerSecond"},
		{name: "handshakes too many", sets: []string{"webhook.maxHandshakesPerSecond=10001"}, wantErr: "/webhook/maxHandshakesPerSecond"},
		{name: "handshakes not a number", sets: []string{"webhook.maxHandshakesPerSecond=many"}, wantErr: "/webhook/maxHandshakesPerSecond"},
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
			if got := flagValue(r.webhookContainer(t).Command, tc.flag); got != tc.want {
				t.Errorf("webhook %s=%s, want %s", tc.flag, got, tc.want)
			}
		})
	}
}
