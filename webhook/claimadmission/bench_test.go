package claimadmission

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation/claimvalidationtest"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
)

// benchCluster: nodes × 8 GPUs; every tenth node is of an older generation.
func benchCluster(b testing.TB, nodes int) *inventory.Objects {
	st := loadInventory(b)
	st.Slices, st.Nodes = nil, nil
	for i := range nodes {
		name := fmt.Sprintf("node-%04d", i)
		model, mem := "LATEST-GPU-MODEL", "80Gi"
		if i%10 == 9 {
			model, mem = "OLD-GPU-MODEL", "40Gi"
		}
		st.Nodes = append(st.Nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
		st.Slices = append(st.Slices, claimvalidationtest.GPUSlice(name, 8, model, "", resource.MustParse(mem)))
	}
	return st
}

// BenchmarkValidate sends AdmissionReviews through the Handler's ServeHTTP, as the server serves
// them, and reports latency percentiles. The objects cycle through the
// valid corpus (every shape of request) in all three versions.
func BenchmarkValidate(b *testing.B) {
	files := []string{"seed-v1beta1", "seed-v1", "first-available", "constraints", "multiple-requests", "all-mode", "opaque-config", "single-claim"}
	var objs []runtime.Object
	for _, f := range files {
		objs = append(objs, validObject(b, f))
	}
	for _, mode := range []struct {
		name string
		// namespaces the objects come from: verdicts are cached by namespace and spec.
		namespaces int
	}{
		// Repeated specs answered from the verdict cache, as for pods created from one template.
		{name: "verdict-cache", namespaces: 1},
		// More distinct questions than the verdict cache holds, asked in turn: every one runs the
		// allocator (selector and match caches still on).
		{name: "no-verdict-cache", namespaces: 256},
	} {
		var bodies [][]byte
		for i := range mode.namespaces {
			for _, obj := range objs {
				obj = obj.DeepCopyObject()
				obj.(metav1.Object).SetNamespace(fmt.Sprintf("ns-%d", i))
				bodies = append(bodies, reviewBody(b, obj))
			}
		}
		for _, nodes := range []int{1, 100, 1000} {
			benchValidate(b, mode.name, nodes, files, bodies)
		}
	}
}

func benchValidate(b *testing.B, mode string, nodes int, files []string, bodies [][]byte) {
	b.Run(fmt.Sprintf("%s/nodes=%d", mode, nodes), func(b *testing.B) {
		wh := &Handler{Validator: newValidator(b, benchCluster(b, nodes))}
		serve := func(body []byte) *admissionv1.AdmissionResponse {
			req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/validate-resource-claim", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			wh.ServeHTTP(rec, req)
			var out admissionv1.AdmissionReview
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
				b.Fatalf("bad response %s: %v", rec.Body.String(), err)
			}
			return out.Response
		}
		// Warm the caches the way a running server has them, and check the verdicts: the
		// corpus must be admitted without a feasibility warning at every size.
		for _, body := range bodies {
			if resp := serve(body); !resp.Allowed || len(resp.Warnings) > 1 {
				b.Fatalf("corpus object not admitted cleanly: %+v %q", resp.Result, resp.Warnings)
			}
		}
		if os.Getenv("BENCH_DEBUG") != "" {
			for i, body := range bodies[:len(files)] {
				start := time.Now()
				for range 50 {
					serve(body)
				}
				b.Logf("%s: %v", files[i%len(files)], time.Since(start)/50)
			}
		}
		durations := make([]time.Duration, 0, b.N)
		cpuBefore := cpuTime()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			start := time.Now()
			serve(bodies[i%len(bodies)])
			durations = append(durations, time.Since(start))
		}
		b.StopTimer()
		// Wall-clock percentiles include time the machine gave to other processes; CPU time per
		// admission is what this process actually spent (all goroutines, GC included).
		b.ReportMetric(float64((cpuTime()-cpuBefore).Microseconds())/float64(b.N), "cpu-us/op")
		sort.Slice(durations, func(i, j int) bool { return durations[i] < durations[j] })
		pct := func(p float64) float64 {
			return float64(durations[int(float64(len(durations)-1)*p)].Microseconds()) / 1000
		}
		b.ReportMetric(pct(0.50), "p50-ms")
		b.ReportMetric(pct(0.99), "p99-ms")
	})
}

func reviewBody(b testing.TB, obj runtime.Object) []byte {
	raw, err := json.Marshal(obj)
	if err != nil {
		b.Fatal(err)
	}
	gvk := obj.GetObjectKind().GroupVersionKind()
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       "bench",
			Kind:      metav1.GroupVersionKind{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind},
			Resource:  metav1.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resourceOf(gvk.Kind)},
			Namespace: obj.(metav1.Object).GetNamespace(),
			Operation: admissionv1.Create,
			Object:    runtime.RawExtension{Raw: raw},
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	return body
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
