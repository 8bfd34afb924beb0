package podinject

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

// hostileQuantities cost resource.ParseQuantity about the square of their exponent (the first
// held a review a second, the second minutes) or of their length.
var hostileQuantities = map[string]struct{ value, reason string }{
	"negative exponent": {"1e-5000000", "exponent out of range"},
	"huge exponent":     {"1e-99999999", "exponent out of range"},
	"positive exponent": {"1E5000000", "exponent out of range"},
	"long digits":       {strings.Repeat("9", 200000), "longer than 64 bytes"},
}

// TestHostileQuantities: a quantity whose parsing would hold the handler past its deadline is
// denied, naming the field, the reason and the fix, for little memory, whether it comes as the
// memory annotation or as a container's limit of the GPU resource (a JSON string or number).
func TestHostileQuantities(t *testing.T) {
	h := mustHandler(t, WithDeviceClasses(chartDefault...), WithCluster(&fakeCluster{}))
	for name, q := range hostileQuantities {
		for _, tc := range []struct {
			how, pod, field, fix string
		}{{
			how:   "annotation",
			pod:   fmt.Sprintf(`{"metadata":{"name":"p","namespace":"ns","annotations":{"gpu.example.com/count":"1","gpu.example.com/memory":%q}},"spec":{"containers":[{"name":"app"}]}}`, q.value),
			field: "metadata.annotations[gpu.example.com/memory]",
			fix:   "e.g. 40Gi",
		}, {
			how:   "limit string",
			pod:   fmt.Sprintf(`{"metadata":{"name":"p","namespace":"ns"},"spec":{"containers":[{"name":"app","resources":{"limits":{"gpu.example.com/gpu":%q}}}]}}`, q.value),
			field: "spec.containers[0].resources.limits[gpu.example.com/gpu]",
			fix:   "use a whole number of GPUs",
		}, {
			how:   "limit number",
			pod:   fmt.Sprintf(`{"metadata":{"name":"p","namespace":"ns"},"spec":{"containers":[{"name":"app","resources":{"limits":{"gpu.example.com/gpu":%s}}}]}}`, q.value),
			field: "spec.containers[0].resources.limits[gpu.example.com/gpu]",
			fix:   "use a whole number of GPUs",
		}} {
			body := reviewBody(t, admissionv1.SchemeGroupVersion.String(), admissionRequestRaw(admissionv1.Create, []byte(tc.pod)))
			for server, serve := range servers(h) {
				t.Run(name+"/"+tc.how+"/"+server, func(t *testing.T) {
					var resp admissionv1.AdmissionReview
					// A review costs some 100 KiB of decoding and encoding; parsing the first
					// value alone used to allocate 24 MiB, the long digits more.
					if allocated := bytesPerRun(2, func() { resp = post(t, serve, "application/json", body) }); allocated > 1<<20+2*uint64(len(body)) {
						t.Errorf("%d bytes allocated per review, want at most 1 MiB beyond the body", allocated)
					}
					r := resp.Response
					if r.Allowed || r.Result == nil || r.Result.Code != http.StatusForbidden {
						t.Fatalf("want a denial, got allowed=%t %+v", r.Allowed, r.Result)
					}
					for _, want := range []string{tc.field, q.reason, tc.fix} {
						if !strings.Contains(r.Result.Message, want) {
							t.Errorf("message does not say %q: %.400s", want, r.Result.Message)
						}
					}
				})
			}
		}
	}
}
