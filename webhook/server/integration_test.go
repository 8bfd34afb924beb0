package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

type integrationCase struct {
	Name    string          `json:"name"`
	Error   string          `json:"error"`
	Warning string          `json:"warning"`
	Object  json.RawMessage `json:"object"`
}

// validatingConfig is what the chart installs; envtest points it at the local server.
func validatingConfig() *admissionregistrationv1.ValidatingWebhookConfiguration {
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-dra-validate"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "resourceclaims.gpu.example.com",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
				Namespace: "gpu-dra", Name: "gpu-dra-webhook",
				// envtest prefixes "https://host:port/".
				Path: ptr.To(strings.TrimPrefix(ValidateClaimPath, "/")),
			}},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{
					APIGroups:   []string{"resource.k8s.io"},
					APIVersions: []string{"v1", "v1beta2", "v1beta1"},
					Resources:   []string{"resourceclaims", "resourceclaimtemplates"},
				},
			}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestThroughAPIServer(t *testing.T) {
	for _, tc := range []struct {
		name, runtimeConfig, version string
	}{
		{name: "all-versions", runtimeConfig: testapiserver.AllVersions, version: "v1"},
		{name: "v1beta1-only", runtimeConfig: testapiserver.V1Beta1Only, version: "v1beta1"},
	} {
		t.Run(tc.name, func(t *testing.T) { testThroughAPIServer(t, tc.runtimeConfig, tc.version) })
	}
}

func testThroughAPIServer(t *testing.T, runtimeConfig, version string) {
	assets := testapiserver.AssetsDir(t)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	srv := testapiserver.Start(t, testapiserver.WithRuntimeConfig(runtimeConfig), testapiserver.WithWebhooks(envtest.WebhookInstallOptions{
		ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{validatingConfig()},
	}))
	if got := srv.ServedResourceVersions(t); got[0] != version {
		t.Fatalf("server serves %v, want %s first", got, version)
	}
	const ns = "gpu-test"
	// Admin access needs the namespace's consent.
	if _, err := srv.Clientset.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: ns, Labels: map[string]string{"resource.kubernetes.io/admin-access": "true"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	populate(ctx, t, srv.Clientset)

	startWebhook(ctx, t, srv, func(o *Options) { o.NodeGroupsFile = "testdata/node-groups.yaml" })

	admin, err := srv.Env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubectl, err := admin.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	kubectl.Path = filepath.Join(assets, "kubectl")
	apply := func(t *testing.T, obj runtime.Object, dryRun bool) (string, error) {
		t.Helper()
		data, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "manifest.yaml")
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
		args := []string{"apply", "-n", ns, "-f", file}
		if dryRun {
			args = append(args, "--dry-run=server")
		}
		stdout, stderr, err := kubectl.Run(args...)
		out, _ := io.ReadAll(stdout)
		errOut, _ := io.ReadAll(stderr)
		return string(out) + string(errOut), err
	}

	exactly := "exactly."
	if version == "v1beta1" {
		exactly = ""
	}
	data, err := os.ReadFile("testdata/integration.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cases []integrationCase
	if err := yaml.UnmarshalStrict(data, &cases); err != nil {
		t.Fatalf("testdata/integration.yaml: %v", err)
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			out, err := apply(t, convert(t, c.Object, version), true)
			t.Logf("kubectl apply --dry-run=server:\n%s", out)
			if c.Error != "" {
				want := strings.ReplaceAll(c.Error, "{exactly}", exactly)
				if err == nil || !strings.Contains(out, "denied the request") || !strings.Contains(out, want) {
					t.Fatalf("kubectl err=%v output:\n%s\nwant denial containing: %s", err, out, want)
				}
				return
			}
			if err != nil {
				t.Fatalf("kubectl: %v\n%s", err, out)
			}
			want := "Warning: " + strings.ReplaceAll(c.Warning, "{exactly}", exactly)
			if !strings.Contains(out, want) {
				t.Fatalf("output:\n%s\nwant a line containing: %s", out, want)
			}
		})
	}

	corpus, err := filepath.Glob("../../internal/analysis/claimvalidation/testdata/valid/*.yaml")
	if err != nil || len(corpus) == 0 {
		t.Fatalf("no corpus: %v", err)
	}
	for _, f := range corpus {
		t.Run("create "+filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			obj := convert(t, raw, version)
			// Both seed forms are named "example"; a second apply of the same spec would be a no-op.
			obj.(metav1.Object).SetName(strings.TrimSuffix(filepath.Base(f), ".yaml"))
			out, err := apply(t, obj, false)
			if err != nil {
				t.Fatalf("kubectl apply: %v\n%s", err, out)
			}
			ours := "is deprecated and removed in Kubernetes 1.38"
			if version == "v1" && strings.Contains(out, "Warning:") {
				t.Fatalf("unexpected warning:\n%s", out)
			}
			if version != "v1" && !strings.Contains(out, ours) {
				t.Fatalf("no deprecation warning:\n%s", out)
			}
			if strings.Contains(out, "nothing currently published") || strings.Contains(out, "does not exist") {
				t.Fatalf("false positive:\n%s", out)
			}
		})
	}
}

// convert renders a manifest in the version the server serves.
func convert(t *testing.T, raw []byte, version string) runtime.Object {
	t.Helper()
	obj, err := resourceversion.Decode(raw, schema.GroupVersionKind{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := obj.To(version)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// startWebhook runs the webhook binary's runner (NewRunner, Setup) on the address srv's webhook
// configurations call, until ctx ends or the test does; edit sets the options a test needs. Ports
// are found free and bound later: envtest's serving port and the probe's were once the same port
// the kernel handed out twice (CI), so the probe's must differ from it, and a start that finds a
// port taken is tried again.
func startWebhook(ctx context.Context, t *testing.T, srv *testapiserver.Server, edit func(*Options)) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		err := tryStartWebhook(ctx, t, srv, edit)
		if err == nil {
			return
		}
		if attempt == 3 || !(errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")) {
			t.Fatal(err)
		}
		t.Logf("attempt %d: %v; again on another port", attempt, err)
	}
}

func tryStartWebhook(ctx context.Context, t *testing.T, srv *testapiserver.Server, edit func(*Options)) error {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	wio := srv.Env.WebhookInstallOptions
	probe := freeAddr(t)
	for strings.HasSuffix(probe, fmt.Sprintf(":%d", wio.LocalServingPort)) {
		probe = freeAddr(t)
	}
	opts := NewOptions()
	// The API server's own namespace unless a test names another.
	opts.Namespace = "default"
	opts.CertDir, opts.Host, opts.Port = wio.LocalServingCertDir, wio.LocalServingHost, wio.LocalServingPort
	opts.HealthProbeBindAddress, opts.MetricsBindAddress = probe, "0"
	edit(opts)
	runner, err := NewRunner(srv.Config, opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := Setup(runner, opts); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- runner.Start(ctx) }()
	if err := waitReady("http://"+probe+"/readyz", done); err != nil {
		cancel()
		return err
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("runner: %v", err)
		}
	})
	return nil
}

// waitReady polls url until it answers 200, the runner ends (its error returned) or a minute
// passes.
func waitReady(url string, done <-chan error) error {
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			return fmt.Errorf("runner ended before the webhook was ready: %w", err)
		default:
		}
		resp, err := http.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("webhook not ready after a minute: %s", last)
}
