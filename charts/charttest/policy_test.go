package charttest

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gpu-dra/gpu-dra/certs"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

const webhookSA = "system:serviceaccount:" + releaseNS + ":gpu-dra-webhook"

// testWebhookConfigPolicy acts as the webhook's service account (self mode), which RBAC lets
// update its two webhook configurations: the certificate code's own caBundle patch goes through,
// any other change is denied by the chart's admission policy.
func testWebhookConfigPolicy(t *testing.T, srv *testapiserver.Server) {
	ctx := t.Context()
	const name = "gpu-dra-webhook"
	admin := srv.Clientset.AdmissionregistrationV1()
	asWebhook := kubernetes.NewForConfigOrDie(impersonate(srv.Config, name, nil)).AdmissionregistrationV1()
	dryRun := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}

	updateValidating := func(change func(*admissionregistrationv1.ValidatingWebhookConfiguration)) error {
		c, err := asWebhook.ValidatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(c)
		_, err = asWebhook.ValidatingWebhookConfigurations().Update(ctx, c, dryRun)
		return err
	}
	updateMutating := func(change func(*admissionregistrationv1.MutatingWebhookConfiguration)) error {
		c, err := asWebhook.MutatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(c)
		_, err = asWebhook.MutatingWebhookConfigurations().Update(ctx, c, dryRun)
		return err
	}
	dropSelector := func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
		c.Webhooks[0].NamespaceSelector = &metav1.LabelSelector{}
	}

	// Policies take effect asynchronously once their type checking ran.
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		last = updateValidating(dropSelector)
		return last != nil, nil
	}); err != nil {
		t.Fatalf("the webhook's service account could drop its namespaceSelector: %v", err)
	}
	const wantDenial = "may change only clientConfig.caBundle of its webhook configurations"
	if !strings.Contains(last.Error(), wantDenial) {
		t.Errorf("denial does not explain itself: %v", last)
	}

	// What the webhook does in self mode, as the webhook: first CA, then a renewed one.
	patcher := certs.CABundlePatcher{Client: asWebhook, Validating: name, Mutating: name}
	for i := range 2 {
		bundle, _, err := certs.Renew(certs.Bundle{}, []string{"localhost"}, time.Now(), certs.Lifetimes{})
		if err != nil {
			t.Fatal(err)
		}
		if err := patcher.Patch(ctx, bundle.CACert); err != nil {
			t.Fatalf("caBundle patch %d as the webhook: %v", i+1, err)
		}
		v, err := admin.ValidatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m, err := admin.MutatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if string(v.Webhooks[0].ClientConfig.CABundle) != string(bundle.CACert) || string(m.Webhooks[0].ClientConfig.CABundle) != string(bundle.CACert) {
			t.Errorf("caBundle patch %d did not land", i+1)
		}
	}

	for _, tc := range []struct {
		name string
		do   func() error
	}{
		{"drop the namespaceSelector", func() error { return updateValidating(dropSelector) }},
		{"widen the rules", func() error {
			return updateValidating(func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
				c.Webhooks[0].Rules[0].Operations = append(c.Webhooks[0].Rules[0].Operations, admissionregistrationv1.Update)
			})
		}},
		{"drop the matchConditions", func() error {
			return updateMutating(func(c *admissionregistrationv1.MutatingWebhookConfiguration) { c.Webhooks[0].MatchConditions = nil })
		}},
		{"fail open", func() error {
			return updateValidating(func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
				c.Webhooks[0].FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
			})
		}},
		{"point the service elsewhere", func() error {
			return updateValidating(func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
				c.Webhooks[0].ClientConfig.Service.Name = "somewhere-else"
			})
		}},
		{"caBundle and a widening together", func() error {
			return updateValidating(func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
				c.Webhooks[0].ClientConfig.CABundle = []byte("x")
				dropSelector(c)
			})
		}},
		{"a label", func() error {
			return updateValidating(func(c *admissionregistrationv1.ValidatingWebhookConfiguration) { c.Labels["extra"] = "1" })
		}},
		{"widen the pod rule", func() error {
			return updateMutating(func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
				c.Webhooks[0].Rules[0].Operations = []admissionregistrationv1.OperationType{admissionregistrationv1.OperationAll}
			})
		}},
		{"reinvocation (a mutating-only field)", func() error {
			return updateMutating(func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
				c.Webhooks[0].ReinvocationPolicy = ptr.To(admissionregistrationv1.IfNeededReinvocationPolicy)
			})
		}},
		{"add a webhook", func() error {
			return updateMutating(func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
				w := c.Webhooks[0]
				w.Name = "all-pods.gpu.example.com"
				w.MatchConditions = nil
				c.Webhooks = append(c.Webhooks, w)
			})
		}},
		{"remove a webhook", func() error {
			return updateMutating(func(c *admissionregistrationv1.MutatingWebhookConfiguration) { c.Webhooks = nil })
		}},
	} {
		if err := tc.do(); err == nil || !strings.Contains(err.Error(), wantDenial) {
			t.Errorf("the webhook's service account may %s: err = %v, want denied", tc.name, err)
		}
	}

	// Anyone else (helm upgrade) is not restricted.
	c, err := admin.ValidatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dropSelector(c)
	if _, err := admin.ValidatingWebhookConfigurations().Update(ctx, c, dryRun); err != nil {
		t.Errorf("the policy restricts other users: %v", err)
	}

	// What an operator checks: RBAC says yes, the policy says no.
	kubectl := adminKubectl(t, srv)
	for _, args := range [][]string{
		{"auth", "can-i", "update", "validatingwebhookconfigurations/" + name, "--as=" + webhookSA},
		{"auth", "can-i", "update", "validatingwebhookconfigurations/another-webhook", "--as=" + webhookSA},
		{"patch", "validatingwebhookconfiguration", name, "--as=" + webhookSA, "--dry-run=server", "--type=json",
			"-p", `[{"op":"replace","path":"/webhooks/0/namespaceSelector","value":{}}]`},
	} {
		out, err := kubectl(args...)
		t.Logf("$ kubectl %s\n%s(err: %v)", strings.Join(args, " "), out, err)
		answer, _, _ := strings.Cut(out, "\n")
		switch {
		case args[0] == "patch" && (err == nil || !strings.Contains(out, wantDenial)):
			t.Errorf("kubectl patch as the webhook: err %v, output %q, want the policy's denial", err, out)
		case args[0] == "auth" && strings.Contains(args[3], "/"+name) && answer != "yes":
			t.Errorf("kubectl auth can-i for its own configuration = %q, want yes (RBAC allows it; the policy limits it)", out)
		case args[0] == "auth" && !strings.Contains(args[3], "/"+name) && answer != "no":
			t.Errorf("kubectl auth can-i for another configuration = %q, want no", out)
		}
	}
}

// adminKubectl returns a function running the API server's kubectl as a cluster admin; it returns
// standard output and error together.
func adminKubectl(t *testing.T, srv *testapiserver.Server) func(args ...string) (string, error) {
	t.Helper()
	user, err := srv.Env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	k, err := user.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	k.Path = filepath.Join(testapiserver.AssetsDir(t), "kubectl")
	return func(args ...string) (string, error) {
		stdout, stderr, err := k.Run(args...)
		o, _ := io.ReadAll(stdout)
		e, _ := io.ReadAll(stderr)
		return string(o) + string(e), err
	}
}
