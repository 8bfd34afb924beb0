package podinject

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/internal/allocs"
)

// hostilePod is the pod of issue 15: 18 KB of JSON, 100 app containers with long names and a
// containers annotation of 2,000 names none of which exists. Each unknown name used to add an error
// repeating the whole container list: seconds of CPU, gigabytes allocated, a 13 MB message.
func hostilePod(t testing.TB) []byte {
	t.Helper()
	type container struct {
		Name  string `json:"name"`
		Image string `json:"image"`
	}
	containers := make([]container, 100)
	for i := range containers {
		containers[i] = container{Name: fmt.Sprintf("a-container-with-a-long-name-%03d", i), Image: "busybox"}
	}
	bogus := make([]string, 2000)
	for i := range bogus {
		bogus[i] = fmt.Sprintf("n%04d", i)
	}
	pod, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"name": "hostile", "namespace": "ns", "annotations": map[string]string{
			"gpu.example.com/count":      "1",
			"gpu.example.com/containers": strings.Join(bogus, ","),
		}},
		"spec": map[string]any{"containers": containers},
	})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// maxHostileMessage bounds what one denial may say: a message is for a person to read.
const maxHostileMessage = 4 << 10

// TestHostileReviewCost: the hostile pod is denied with a short message that still says how many
// names are wrong, for less than 1 MB allocated per review (the time is BenchmarkReviewHostile's).
func TestHostileReviewCost(t *testing.T) {
	pod := hostilePod(t)
	if len(pod) < 17<<10 || len(pod) > 19<<10 {
		t.Fatalf("hostile pod of %d bytes, want about 18 KB", len(pod))
	}
	body := reviewBody(t, admissionv1.SchemeGroupVersion.String(), admissionRequest(t, admissionv1.Create, false, pod))
	for name, serve := range servers(mustHandler(t)) {
		t.Run(name, func(t *testing.T) {
			resp := post(t, serve, "application/json", body).Response
			if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusForbidden {
				t.Fatalf("want a denial, got allowed=%t %+v", resp.Allowed, resp.Result)
			}
			msg := resp.Result.Message
			if len(msg) > maxHostileMessage {
				t.Errorf("message of %d bytes, want at most %d: %.300s...", len(msg), maxHostileMessage, msg)
			}
			for _, want := range []string{`no containers "n0000", "n0001"`, "and 1990 more", "a-container-with-a-long-name-000", "and 90 more"} {
				if !strings.Contains(msg, want) {
					t.Errorf("message does not say %q: %.600s", want, msg)
				}
			}
			if allocated := bytesPerRun(3, func() { post(t, serve, "application/json", body) }); allocated > 1<<20 {
				t.Errorf("%d bytes allocated per review, want less than 1 MiB", allocated)
			}
		})
	}
}

// bytesPerRun is the fewest bytes f allocated in runs calls: like testing.AllocsPerRun, but in bytes
// and robust against a background allocation landing in one of the runs.
func bytesPerRun(runs int, f func()) uint64 {
	var least uint64
	for i := range runs {
		if n := allocs.Bytes(f); i == 0 || n < least {
			least = n
		}
	}
	return least
}

func mustHandler(t testing.TB, opts ...Option) *Handler {
	t.Helper()
	h, err := NewHandler(&fakeClient{}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// BenchmarkReviewHostile is the hostile pod's review through the one-pass ServeHTTP.
func BenchmarkReviewHostile(b *testing.B) {
	body := reviewBody(b, admissionv1.SchemeGroupVersion.String(), admissionRequest(b, admissionv1.Create, false, hostilePod(b)))
	h := mustHandler(b)
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(discardResponse{}, httpReview("application/json", body))
	}
}

// discardResponse is an http.ResponseWriter that keeps nothing.
type discardResponse struct{}

func (discardResponse) Header() http.Header         { return http.Header{} }
func (discardResponse) Write(p []byte) (int, error) { return len(p), nil }
func (discardResponse) WriteHeader(int)             {}

// TestHandleHonoursDeadline: a review whose deadline has passed (the API server sends its webhook
// timeout as ?timeout=) or whose caller left is answered with an error and creates no template.
func TestHandleHonoursDeadline(t *testing.T) {
	for name, pod := range gpuPodsIn("ns") {
		t.Run(name, func(t *testing.T) {
			req := admissionRequest(t, admissionv1.Create, false, pod)

			client := &fakeClient{}
			h, err := NewHandler(client)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if resp := h.Handle(ctx, req); resp.Allowed || resp.Result.Code != http.StatusRequestTimeout {
				t.Errorf("Handle with the caller gone: allowed=%t %+v, want a 408", resp.Allowed, resp.Result)
			}

			r := httpReview("application/json", reviewBody(t, admissionv1.SchemeGroupVersion.String(), req))
			r.URL.RawQuery = "timeout=1ns"
			out := postRequest(t, h, r)
			if out.Response.Allowed || out.Response.Result.Code != http.StatusRequestTimeout || !strings.Contains(out.Response.Result.Message, "deadline exceeded") {
				t.Errorf("ServeHTTP past ?timeout=: allowed=%t %+v, want a 408 naming the deadline", out.Response.Allowed, out.Response.Result)
			}
			if client.calls != 0 {
				t.Errorf("%d templates ensured for reviews nobody waits for", client.calls)
			}
			// The same review within its timeout is injected.
			r = httpReview("application/json", reviewBody(t, admissionv1.SchemeGroupVersion.String(), req))
			r.URL.RawQuery = "timeout=10s"
			if resp := postRequest(t, h, r).Response; !resp.Allowed || len(resp.Patch) == 0 {
				t.Errorf("within ?timeout=10s: not injected: %+v", resp.Result)
			}
		})
	}
}

// gpuPodsIn are a pod in namespace ns asking for a GPU each way the handler serves: by annotation,
// and in its limits, by the implicit extended resource name of the default DeviceClass (which the
// handler turns into a claim, as on a cluster without KEP-5004).
func gpuPodsIn(ns string) map[string][]byte {
	return map[string][]byte{
		"annotation": []byte(`{"metadata":{"name":"p","namespace":"` + ns + `","annotations":{"gpu.example.com/count":"1"}},"spec":{"containers":[{"name":"app"}]}}`),
		"limits":     []byte(`{"metadata":{"name":"p","namespace":"` + ns + `"},"spec":{"containers":[{"name":"app","resources":{"limits":{"deviceclass.resource.kubernetes.io/gpu.example.com":"1"}}}]}}`),
	}
}

func postRequest(t testing.TB, serve http.Handler, r *http.Request) admissionv1.AdmissionReview {
	t.Helper()
	w := httptest.NewRecorder()
	serve.ServeHTTP(w, r)
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Response == nil {
		t.Fatalf("status %d, answer %q: not an AdmissionReview response (%v)", w.Code, w.Body.String(), err)
	}
	return out
}

// TestDeniedBounds: however many errors a review has and however long their values, the denial
// names ten, counts the rest and stays readable, in the shape of every denial of the webhook.
func TestDeniedBounds(t *testing.T) {
	pod := &podView{}
	pod.Metadata.GenerateName = "web-"
	path := field.NewPath("spec", "resourceClaims")
	var many field.ErrorList
	for i := range 25 {
		many = append(many, field.Invalid(path.Index(i), "x", "reserved"))
	}
	msg := denied(pod, many).Result.Message
	if !strings.HasPrefix(msg, `Pod "web-*" is invalid: `) || !strings.HasSuffix(msg, `; spec.resourceClaims[9]: Invalid value: "x": reserved; and 15 more errors`) || strings.Contains(msg, "[10]") {
		t.Errorf("25 errors: %s", msg)
	}
	long := field.ErrorList{field.Invalid(path.Index(0), strings.Repeat("é", 1<<20), "reserved")}
	msg = denied(pod, long).Result.Message
	if len(msg) > maxHostileMessage+64 || !strings.HasSuffix(msg, " bytes more)") || !utf8.ValidString(msg) {
		t.Errorf("a 2 MB value: %d bytes, ending %q", len(msg), msg[max(0, len(msg)-40):])
	}
	one := field.ErrorList{field.Invalid(path.Index(0), "x", "reserved")}
	if msg := denied(pod, one).Result.Message; msg != `Pod "web-*" is invalid: `+one.ToAggregate().Error() {
		t.Errorf("one error: %q, want it after the pod's name", msg)
	}
}

// TestStalledBodiesHoldNoMemory: a review is read as it arrives, never sized from what its
// Content-Length announces: 40 requests that announce 7 MB and send nothing held 280 MiB.
func TestStalledBodiesHoldNoMemory(t *testing.T) {
	h := mustHandler(t)
	const n = 40
	var reading, done sync.WaitGroup
	release := make(chan struct{})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n {
		reading.Add(1)
		done.Go(func() {
			r := httptest.NewRequest(http.MethodPost, Path, &stalledBody{reading: &reading, release: release})
			// Each ends as a bad review; their 40 log lines say nothing here.
			r = r.WithContext(klog.NewContext(r.Context(), logr.Discard()))
			r.Header.Set("Content-Type", "application/json")
			r.ContentLength = maxReviewSize
			h.ServeHTTP(httptest.NewRecorder(), r)
		})
	}
	reading.Wait()
	runtime.GC()
	runtime.ReadMemStats(&after)
	close(release)
	done.Wait()
	if held := int(after.HeapAlloc) - int(before.HeapAlloc); held > 4<<20 {
		t.Errorf("%d requests that sent no body hold %d bytes", n, held)
	}
}

// stalledBody is a request body that never arrives: its first Read reports that the handler is
// reading, then waits for release.
type stalledBody struct {
	reading *sync.WaitGroup
	release chan struct{}
	once    sync.Once
}

func (b *stalledBody) Read([]byte) (int, error) {
	b.once.Do(b.reading.Done)
	<-b.release
	return 0, io.ErrUnexpectedEOF
}

// TestPooledBodyIsNotAliased: the buffer a review was read into is reused for the next one; what
// was decoded from it must not change when that happens.
func TestPooledBodyIsNotAliased(t *testing.T) {
	read := func(ns, container string) *podReview {
		pod := []byte(`{"metadata":{"name":"p","namespace":"` + ns + `","annotations":{"gpu.example.com/count":"1"}},"spec":{"containers":[{"name":"` + container + `"}]}}`)
		review, _, err := readPodReview(httpReview("application/json", reviewBody(t, admissionv1.SchemeGroupVersion.String(), admissionRequest(t, admissionv1.Create, false, pod))))
		if err != nil {
			t.Fatal(err)
		}
		return review
	}
	first := read("first-namespace", "first-container")
	for range 10 {
		read("other-namespace", "other-container")
	}
	if got := first.Request.Object; got.Metadata.Namespace != "first-namespace" || got.Spec.Containers[0].Name != "first-container" || first.Request.Namespace != "first-namespace" {
		t.Errorf("a decoded review changed when its buffer was reused: %+v", got)
	}
}

// TestExcludedNamespaces: a review for a namespace the webhook configuration excludes can only
// have been posted straight to the Service (anyone in the cluster can): it is denied and nothing is
// created there. So is a review that names no namespace at all.
func TestExcludedNamespaces(t *testing.T) {
	for way := range gpuPodsIn("") {
		t.Run(way, func(t *testing.T) { testExcludedNamespaces(t, func(ns string) []byte { return gpuPodsIn(ns)[way] }) })
	}
}

func testExcludedNamespaces(t *testing.T, podIn func(ns string) []byte) {
	for _, tc := range []struct {
		name, requestNS string
		pod             []byte
		want            string // the denial; "" for injected
	}{
		{"kube-system", "kube-system", podIn("kube-system"), "namespace kube-system is excluded from GPU injection by the webhook configuration, whose namespaceSelector keeps its pods from ever being sent here; create GPU pods in another namespace"},
		{"the release namespace", "gpu-dra", podIn("gpu-dra"), "namespace gpu-dra is excluded from GPU injection by the webhook configuration, whose namespaceSelector keeps its pods from ever being sent here; create GPU pods in another namespace"},
		{"only the pod names it", "", podIn("kube-system"), "namespace kube-system is excluded from GPU injection by the webhook configuration, whose namespaceSelector keeps its pods from ever being sent here; create GPU pods in another namespace"},
		{"no namespace", "", podIn(""), "the review names no namespace; the API server always names the pod's"},
		{"another namespace", "team-a", podIn("team-a"), ""},
	} {
		for _, dryRun := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/dryRun=%t", tc.name, dryRun), func(t *testing.T) {
				client := &fakeClient{}
				h, err := NewHandler(client, WithExcludedNamespaces("kube-system", "gpu-dra"))
				if err != nil {
					t.Fatal(err)
				}
				req := admissionRequest(t, admissionv1.Create, dryRun, tc.pod)
				req.Namespace = tc.requestNS
				for name, serve := range servers(h) {
					resp := review(t, serve, admissionv1.SchemeGroupVersion.String(), req)
					if tc.want == "" {
						if !resp.Allowed || len(resp.Patch) == 0 {
							t.Errorf("%s: not injected: %+v", name, resp.Result)
						}
						continue
					}
					if resp.Allowed || resp.Result.Code != http.StatusForbidden || resp.Result.Message != tc.want {
						t.Errorf("%s: allowed=%t %+v, want denied: %s", name, resp.Allowed, resp.Result, tc.want)
					}
				}
				if tc.want != "" && client.calls != 0 {
					t.Errorf("templates ensured: %q", client.names())
				}
			})
		}
	}
}
