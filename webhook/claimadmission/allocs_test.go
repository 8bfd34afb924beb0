package claimadmission

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
)

// discard is a ResponseWriter that allocates nothing, so that only the review's own allocations
// are counted.
type discard struct{ header http.Header }

func (d *discard) Header() http.Header         { return d.header }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

// TestCachedTemplateReviewAllocs bounds what serving a template review costs the garbage collector
// once its verdict is cached, as for every pod created from one template: at thousands of reviews
// a second the collector's work follows the allocations, and its pauses make the tail. The seed
// template's review must allocate its decoded object (metadata, one request, its selector: about
// 25), the envelope and the response (about 20), the verdict's key (about 10) and the logger's
// values (about 5); controller-runtime's admission.Webhook around the same handler took 163.
func TestCachedTemplateReviewAllocs(t *testing.T) {
	const most = 80
	h := &Handler{Validator: newValidator(t, benchCluster(t, 1000))}
	body := reviewBody(t, validObject(t, "seed-v1"))
	reader := bytes.NewReader(body)
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "/validate-resource-claim", reader)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	w := &discard{header: http.Header{}}
	serve := func() {
		reader.Reset(body)
		req.Body = io.NopCloser(reader)
		h.ServeHTTP(w, req)
	}
	if resp := serveReview(t, h, body); !resp.Allowed {
		t.Fatalf("seed template not admitted: %+v", resp.Result)
	}
	if got := testing.AllocsPerRun(200, serve); got > most {
		t.Errorf("a cached template review allocates %.0f times, want at most %d", got, most)
	}
}
