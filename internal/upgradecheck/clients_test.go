package upgradecheck

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

const metricHeader = "# HELP apiserver_requested_deprecated_apis [STABLE] Gauge of deprecated APIs that have been requested.\n" +
	"# TYPE apiserver_requested_deprecated_apis gauge\n"

func series(group, version, resource, sub, removed, value string) string {
	return `apiserver_requested_deprecated_apis{group="` + group + `",removed_release="` + removed + `",resource="` + resource +
		`",subresource="` + sub + `",version="` + version + `"} ` + value + "\n"
}

// TestDeprecatedRequests: only resource.k8s.io series that were requested are kept, sorted;
// other metrics, even with the name as a prefix, are skipped; malformed input is an error.
func TestDeprecatedRequests(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []string
		err      string
	}{
		{name: "empty", in: ""},
		{name: "no series", in: metricHeader},
		{name: "other groups and zero gauges dropped", in: metricHeader +
			series("policy", "v1beta1", "podsecuritypolicies", "", "1.25", "1") +
			series("resource.k8s.io", "v1beta2", "deviceclasses", "", "1.39", "1") +
			series("resource.k8s.io", "v1beta1", "resourceclaims", "status", "1.38", "1") +
			series("resource.k8s.io", "v1beta1", "resourceslices", "", "1.38", "0") +
			series("resource.k8s.io", "v1beta1", "resourceclaims", "", "1.38", "1"),
			want: []string{"v1beta1/resourceclaims//1.38", "v1beta1/resourceclaims/status/1.38", "v1beta2/deviceclasses//1.39"}},
		{name: "similar names ignored", in: "apiserver_requested_deprecated_apis_total{group=\"resource.k8s.io\"} 1\n" +
			metricHeader + series("resource.k8s.io", "v1beta1", "deviceclasses", "", "1.38", "1"),
			want: []string{"v1beta1/deviceclasses//1.38"}},
		{name: "malformed", in: metricHeader + "apiserver_requested_deprecated_apis{group=\"resource.k8s.io\" 1\n", err: "parse apiserver_requested_deprecated_apis"},
		{name: "line too long", in: "x " + strings.Repeat("a", maxMetricLine+1) + "\n", err: "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DeprecatedRequests(strings.NewReader(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			for _, r := range got {
				keys = append(keys, r.Version+"/"+r.Resource+"/"+r.Subresource+"/"+r.RemovedRelease)
			}
			if strings.Join(keys, " ") != strings.Join(tc.want, " ") {
				t.Errorf("got %v, want %v", keys, tc.want)
			}
		})
	}
}

// TestCheckClients: a request for a version the target removes is not safe, one for a version it
// keeps is safe; a 403 or another error on /metrics, or no way to ask, is "could not tell".
func TestCheckClients(t *testing.T) {
	body := func(s string) func(context.Context) (io.ReadCloser, error) {
		return func(context.Context) (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(s)), nil }
	}
	fail := func(err error) func(context.Context) (io.ReadCloser, error) {
		return func(context.Context) (io.ReadCloser, error) { return nil, err }
	}
	o := options{requestTimeout: defaultRequestTimeout, maxMetrics: 1 << 20}
	beta2 := metricHeader + series("resource.k8s.io", "v1beta2", "deviceclasses", "", "1.39", "1")
	for _, tc := range []struct {
		name    string
		metrics func(context.Context) (io.ReadCloser, error)
		target  string
		want    Status
		reason  string
	}{
		{name: "v1beta2 before 1.39", metrics: body(beta2), target: "1.38", want: Safe},
		{name: "v1beta2 at 1.39", metrics: body(beta2), target: "1.39", want: NotSafe, reason: "move them to resource.k8s.io/v1"},
		{name: "forbidden", metrics: fail(apierrors.NewForbidden(schema.GroupResource{}, "/metrics", errors.New("no"))), target: "1.38", want: Unknown, reason: "403 Forbidden"},
		{name: "unreachable", metrics: fail(errors.New("connection refused")), target: "1.38", want: Unknown, reason: "connection refused"},
		{name: "no connection", target: "1.38", want: Unknown, reason: "no connection"},
		{name: "longer than the bound", metrics: body(strings.Repeat("# padding line\n", 1<<17) + beta2), target: "1.39", want: Unknown, reason: "longer than 1048576 bytes"},
		{name: "just within the bound", metrics: body(strings.Repeat("#\n", (1<<20-len(beta2))/2) + beta2), target: "1.39", want: NotSafe},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target, err := ParseRelease(tc.target)
			if err != nil {
				t.Fatal(err)
			}
			got := checkClients(context.Background(), Conn{Metrics: tc.metrics}, o, target)
			if got.Status != tc.want || !strings.Contains(got.Reason, tc.reason) {
				t.Errorf("status %q reason %q, want %q and a reason containing %q", got.Status, got.Reason, tc.want, tc.reason)
			}
		})
	}
}

func FuzzDeprecatedRequests(f *testing.F) {
	f.Add(metricHeader + series("resource.k8s.io", "v1beta1", "resourceclaims", "", "1.38", "1"))
	f.Fuzz(func(t *testing.T, in string) {
		got, err := DeprecatedRequests(strings.NewReader(in))
		if err != nil {
			return
		}
		for _, r := range got {
			if strings.Count(in, r.Resource) == 0 {
				t.Fatalf("request %+v not in the input", r)
			}
		}
	})
}

// TestCheckClientsTimeout: an API server that never answers /metrics costs one request timeout.
func TestCheckClientsTimeout(t *testing.T) {
	hang := func(ctx context.Context) (io.ReadCloser, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	start := time.Now()
	got := checkClients(context.Background(), Conn{Metrics: hang}, options{requestTimeout: 50 * time.Millisecond, maxMetrics: 1 << 20}, Release{1, 38})
	if got.Status != Unknown || !strings.Contains(got.Reason, "deadline exceeded") {
		t.Errorf("status %q reason %q, want could not tell for the deadline", got.Status, got.Reason)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s, want about the 50ms timeout", d)
	}
}
