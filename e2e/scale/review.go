package scale

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// reviewer sends template AdmissionReviews straight to the webhook over loopback TLS, as the API
// server does, so that the webhook's latency is measured without the API server's share (on this
// kind of machine the API server, not the webhook, saturates first).
type reviewer struct {
	client *http.Client
	url    string
	bodies [][]byte
}

func newReviewer(w *webhook, l *loader, path string) (*reviewer, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(w.ca) {
		return nil, fmt.Errorf("webhook CA: no certificate")
	}
	r := &reviewer{url: w.url() + path, client: &http.Client{Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: maxInFlight,
	}}}
	// As many bodies as the loader has distinct specs.
	for i := range 12 {
		t := &resourceapi.ResourceClaimTemplate{
			TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaimTemplate"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("review-%d", i), Namespace: loadNamespace},
			Spec:       l.templateSpec(i),
		}
		raw, err := json.Marshal(t)
		if err != nil {
			return nil, err
		}
		body, err := json.Marshal(&admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{
				UID:       types.UID(fmt.Sprintf("review-%d", i)),
				Kind:      metav1.GroupVersionKind{Group: "resource.k8s.io", Version: "v1", Kind: "ResourceClaimTemplate"},
				Resource:  metav1.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "resourceclaimtemplates"},
				Name:      t.Name,
				Namespace: loadNamespace,
				Operation: admissionv1.Create,
				Object:    runtime.RawExtension{Raw: raw},
			},
		})
		if err != nil {
			return nil, err
		}
		r.bodies = append(r.bodies, body)
	}
	return r, nil
}

// review sends one AdmissionReview and fails unless the webhook allowed it.
func (r *reviewer) review(ctx context.Context, i int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(r.bodies[i%len(r.bodies)]))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(data, &out); err != nil || out.Response == nil {
		return fmt.Errorf("HTTP %d: not an AdmissionReview: %.200s", resp.StatusCode, data)
	}
	if !out.Response.Allowed {
		return fmt.Errorf("denied: %v", out.Response.Result)
	}
	if len(out.Response.Warnings) > 0 {
		if n, ok := ctx.Value(warningsKey{}).(interface{ Add(int64) int64 }); ok {
			n.Add(1)
		}
	}
	return nil
}
