package liveness

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
)

type nopPlugin struct{}

func (nopPlugin) PrepareResourceClaims(context.Context, []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	return map[types.UID]kubeletplugin.PrepareResult{}, nil
}
func (nopPlugin) UnprepareResourceClaims(context.Context, []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	return map[types.UID]error{}, nil
}
func (nopPlugin) HandleError(context.Context, error, string) {}
func (nopPlugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// TestChecker runs the real kubeletplugin helper and probes its sockets, with the v1 and the
// v1beta1 DRA service, then stops it: the liveness must follow.
func TestChecker(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []kubeletplugin.Option
	}{
		{name: "v1 and v1beta1"},
		{name: "v1beta1 only", opts: []kubeletplugin.Option{kubeletplugin.NodeV1(false)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			base, err := os.MkdirTemp("", "health")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = os.RemoveAll(base) }()
			reg, data := filepath.Join(base, "reg"), filepath.Join(base, "data")
			for _, d := range []string{reg, data} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			helper, err := kubeletplugin.Start(ctx, nopPlugin{}, append([]kubeletplugin.Option{
				kubeletplugin.DriverName("gpu.example.com"), kubeletplugin.KubeClient(fake.NewClientset()),
				kubeletplugin.RegistrarDirectoryPath(reg), kubeletplugin.PluginDataDirectoryPath(data),
			}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			c := &Checker{
				DriverName:         "gpu.example.com",
				RegistrationSocket: filepath.Join(reg, "gpu.example.com-reg.sock"),
				DRASocket:          filepath.Join(data, "dra.sock"),
				Timeout:            2 * time.Second,
			}
			handler := &healthz.Handler{Checks: map[string]healthz.Checker{"sockets": c.Healthz}}
			if code := serve(handler); code != http.StatusOK {
				t.Errorf("healthy plugin: /healthz = %d", code)
			}
			wrongName := *c
			wrongName.DriverName = "other.example.com"
			if err := wrongName.Check(ctx); err == nil || !strings.Contains(err.Error(), `want DRAPlugin "other.example.com"`) {
				t.Errorf("registration for another driver accepted: %v", err)
			}
			helper.Stop()
			err = c.Check(ctx)
			if err == nil || !strings.Contains(err.Error(), c.RegistrationSocket) || !strings.Contains(err.Error(), c.DRASocket) {
				t.Errorf("stopped plugin: Check = %v, want errors naming both sockets", err)
			}
			if code := serve(handler); code != http.StatusInternalServerError {
				t.Errorf("stopped plugin: /healthz = %d", code)
			}
		})
	}
}

func serve(h http.Handler) int {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	return rec.Code
}
