package charttest

import (
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
)

// TestClaimWebhookEntries: this driver's claims wait on the webhook as configured; everything
// else goes to an entry that fails open quickly, or nowhere (routing itself is checked on a real
// API server in testWebhookRouting).
func TestClaimWebhookEntries(t *testing.T) {
	type entry struct {
		name    string
		policy  admissionregistrationv1.FailurePolicyType
		timeout int32
	}
	for _, tc := range []struct {
		name   string
		sets   []string
		driver string
		want   []entry
	}{
		{name: "defaults", driver: "gpu.example.com", want: []entry{
			{"resourceclaims.gpu.example.com", admissionregistrationv1.Fail, 5},
			{"missing-class.resourceclaims.gpu.example.com", admissionregistrationv1.Ignore, 2},
		}},
		{name: "other claims off", sets: []string{"webhook.otherClaims.enabled=false", "webhook.timeoutSeconds=7"}, driver: "gpu.example.com", want: []entry{
			{"resourceclaims.gpu.example.com", admissionregistrationv1.Fail, 7},
		}},
		{name: "other driver name", sets: []string{"driverName=gpu.acme.org", "webhook.failurePolicy=Ignore", "webhook.otherClaims.timeoutSeconds=1"}, driver: "gpu.acme.org", want: []entry{
			{"resourceclaims.gpu.acme.org", admissionregistrationv1.Ignore, 5},
			{"missing-class.resourceclaims.gpu.acme.org", admissionregistrationv1.Ignore, 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRender(t, capabilities(t, clusters[2]), values(t, tc.sets...))
			m, _ := r.find("ValidatingWebhookConfiguration", "")
			var vwc admissionregistrationv1.ValidatingWebhookConfiguration
			decode(t, m, &vwc)
			if len(vwc.Webhooks) != len(tc.want) {
				t.Fatalf("%d webhooks, want %d", len(vwc.Webhooks), len(tc.want))
			}
			for i, w := range vwc.Webhooks {
				got := entry{w.Name, *w.FailurePolicy, *w.TimeoutSeconds}
				if got != tc.want[i] {
					t.Errorf("webhook %d = %+v, want %+v", i, got, tc.want[i])
				}
				var exprs []string
				for _, c := range w.MatchConditions {
					exprs = append(exprs, c.Expression)
				}
				all := strings.Join(exprs, "\n")
				if !strings.Contains(all, "'"+tc.driver+"'") || (tc.driver != "gpu.example.com" && strings.Contains(all, "gpu.example.com")) {
					t.Errorf("webhook %s matchConditions do not name driver %s:\n%s", w.Name, tc.driver, all)
				}
				if !strings.Contains(all, "resource-claim-controller") {
					t.Errorf("webhook %s: the resourceclaim controller's claims are sent", w.Name)
				}
			}
		})
	}
}
