package podinject

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

func testTemplate(t testing.TB, ns string) *resourceapi.ResourceClaimTemplate {
	t.Helper()
	return templateFor(t, ns, 2)
}

// templateFor is the managed template of count GPUs of any model in ns.
func templateFor(t testing.TB, ns string, count int) *resourceapi.ResourceClaimTemplate {
	t.Helper()
	o, err := newOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := o.template(ns, Request{Count: count})
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

// runAPIClient runs c's watch of the managed templates for the test and waits until it listed
// them, as the webhook's readiness does.
func runAPIClient(t testing.TB, c *APIClient) *APIClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	if !cache.WaitForCacheSync(ctx.Done(), c.HasSynced) {
		t.Fatal("managed templates never listed")
	}
	return c
}

// checkEnsureTemplate is shared by the unit test (fake clientset) and the integration test (real
// API server, every served version).
func checkEnsureTemplate(t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	ctx := context.Background()
	c := runAPIClient(t, NewAPIClient(cs))
	tmpl := testTemplate(t, ns)
	for i := range 2 { // the second call meets AlreadyExists, as a second webhook replica would
		if err := c.EnsureTemplate(ctx, tmpl.DeepCopy()); err != nil {
			t.Fatalf("ensure #%d: %v", i+1, err)
		}
	}
	// A template of the same name that someone else made must not be used for GPUs.
	foreign := tmpl.DeepCopy()
	foreign.Name = "gpu-dra-2-0000000000"
	foreign.Labels = nil
	if _, err := c.templates(ns).Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	foreign.Labels = tmpl.Labels
	err := c.EnsureTemplate(ctx, foreign)
	want := "ResourceClaimTemplate " + ns + "/gpu-dra-2-0000000000 exists but is not managed by gpu-dra (label app.kubernetes.io/managed-by=gpu-dra missing); delete or rename it"
	if err == nil || err.Error() != want {
		t.Fatalf("foreign template: %v, want %q", err, want)
	}
}

func TestAPIClient(t *testing.T) {
	cs := fake.NewClientset()
	checkEnsureTemplate(t, cs, "ns")
	got, err := cs.ResourceV1().ResourceClaimTemplates("ns").Get(context.Background(), testTemplate(t, "ns").Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.Spec.Devices.Requests[0].Exactly.Count != 2 || got.Labels[ManagedByLabel] != ManagedBy {
		t.Errorf("stored %+v", got)
	}
}

// errWebhookUnreachable is how the API server answers a write when it could not call a webhook.
var errWebhookUnreachable = apierrors.NewInternalError(errors.New(`failed calling webhook "resourceclaims.gpu.example.com": failed to call webhook: Post "https://gpu-dra-webhook.gpu-dra.svc:443/validate-resource-claim?timeout=5s": dial tcp 10.0.0.80:443: connect: connection refused`))

// A restarting API server or throttling must not turn into a denied pod when a retry a moment
// later succeeds; anything else fails at once.
func TestEnsureTemplateRetriesTransientErrors(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	tests := []struct {
		name      string
		failures  []error // returned by the first creates, in order
		wantCalls int
		wantErr   string
	}{
		{name: "succeeds at once", wantCalls: 1},
		{name: "connection refused twice", failures: []error{refused, refused}, wantCalls: 3},
		{name: "throttled", failures: []error{apierrors.NewTooManyRequests("slow down", 1)}, wantCalls: 2},
		{name: "forbidden is final", failures: []error{apierrors.NewForbidden(resourceapi.Resource("resourceclaimtemplates"), "x", errors.New("rbac"))},
			wantCalls: 1, wantErr: "forbidden"},
		{name: "gives up", failures: []error{refused, refused, refused, refused, refused, refused}, wantCalls: 5, wantErr: "connection refused"},
		// The API server could not reach the claim webhook on the template (a replica going away
		// while its endpoint is still listed): the next call reaches another one.
		{name: "claim webhook unreachable", failures: []error{errWebhookUnreachable}, wantCalls: 2},
		{name: "claim webhook denial is final", failures: []error{apierrors.NewForbidden(resourceapi.Resource("resourceclaimtemplates"), "x",
			errors.New(`admission webhook "resourceclaims.gpu.example.com" denied the request: no`))}, wantCalls: 1, wantErr: "denied"},
		{name: "other internal errors are final", failures: []error{apierrors.NewInternalError(errors.New("etcd is gone"))}, wantCalls: 1, wantErr: "etcd"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			calls := 0
			cs.PrependReactor("create", "resourceclaimtemplates", func(k8stesting.Action) (bool, runtime.Object, error) {
				calls++
				if calls <= len(tc.failures) {
					return true, nil, tc.failures[calls-1]
				}
				return false, nil, nil
			})
			err := runAPIClient(t, NewAPIClient(cs)).EnsureTemplate(context.Background(), testTemplate(t, "ns"))
			if calls != tc.wantCalls {
				t.Errorf("%d creates, want %d", calls, tc.wantCalls)
			}
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}
