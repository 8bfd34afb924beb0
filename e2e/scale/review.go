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
	"net/http/httptrace"
	"sync/atomic"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// reviewer sends template AdmissionReviews straight to the webhook over loopback TLS, as the API
// server does, so that the webhook's latency is measured without the API server's share (on this
// kind of machine the API server, not the webhook, saturates first).
type reviewer struct {
	client *http.Client
	url    string
	bodies [][]byte
	// dialing is the webhook's count of connections its client is making, shared by its reviewers.
	dialing *atomic.Int64
}

// apiServerIdleConns is how many idle connections the API server keeps to one webhook (client-go's
// transport cache, shared by every webhook configuration naming the same service and CA). A load
// leaves no more than that open behind it, so the webhook's memory after a load is read as it would
// be behind an API server, not with hundreds of idle connections the harness alone would keep.
const apiServerIdleConns = 25

// apiServerHandshakeTimeout is how long the API server's webhook client waits for a TLS handshake
// (client-go's transport cache).
const apiServerHandshakeTimeout = 10 * time.Second

// client is w's one HTTP client, shared by every reviewer of w as the API server shares one
// transport. Reviewers are made one after another, never concurrently.
func (w *webhook) client() (*http.Client, error) {
	if w.httpClient != nil {
		return w.httpClient, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(w.ca) {
		return nil, fmt.Errorf("webhook CA: no certificate")
	}
	w.httpClient = &http.Client{Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: apiServerIdleConns,
		// The API server's: a dial left waiting in a busy webhook's listen queue is given up.
		TLSHandshakeTimeout: apiServerHandshakeTimeout,
	}}
	return w.httpClient, nil
}

func newReviewer(w *webhook, path string, objects []runtime.Object) (*reviewer, error) {
	client, err := w.client()
	if err != nil {
		return nil, err
	}
	r := &reviewer{url: w.url() + path, client: client, dialing: &w.dialing}
	for i, obj := range objects {
		raw, err := json.Marshal(obj)
		if err != nil {
			return nil, err
		}
		gvk := obj.GetObjectKind().GroupVersionKind()
		resource := map[string]string{"Pod": "pods", "ResourceClaimTemplate": "resourceclaimtemplates"}[gvk.Kind]
		body, err := json.Marshal(&admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{
				UID:       types.UID(fmt.Sprintf("review-%d", i)),
				Kind:      metav1.GroupVersionKind{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind},
				Resource:  metav1.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resource},
				Namespace: loadNamespace,
				Operation: admissionv1.Create,
				Object:    runtime.RawExtension{Raw: raw},
				// Pods: the webhook plans the template and creates none.
				DryRun: ptr.To(gvk.Kind == "Pod"),
			},
		})
		if err != nil {
			return nil, err
		}
		r.bodies = append(r.bodies, body)
	}
	return r, nil
}

// templateObjects are the loader's distinct templates, as the API server sends them.
func (l *loader) templateObjects() []runtime.Object {
	var out []runtime.Object
	for i := range 12 {
		out = append(out, &resourceapi.ResourceClaimTemplate{
			TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaimTemplate"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("review-%d", i), Namespace: loadNamespace},
			Spec:       l.templateSpec(i),
		})
	}
	return out
}

// podObject is the loader's annotated pod as the API server sends it (generateName, no name yet).
func (l *loader) podObject() []runtime.Object {
	p := l.pod("")
	p.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
	return []runtime.Object{p}
}

// target is r's webhook as a load straight to it sees it, served by process pid.
func (r *reviewer) target(pid int) target {
	return target{review: r.review, pid: pid, dialing: r.dialing}
}

// review sends one AdmissionReview and fails unless the webhook allowed it.
func (r *reviewer) review(ctx context.Context, i int) error {
	// Dials are counted at the handshake, not where a request gets a new connection: a request
	// that dialed and then took a connection another freed leaves its dial going, and that
	// connection's handshake costs the webhook as much. The same goes for the dials still being
	// made: every TCP connection made is followed by a handshake, done or failed.
	dialed, _ := ctx.Value(dialsKey{}).(*atomic.Int64)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		ConnectStart: func(string, string) { r.dialing.Add(1) },
		ConnectDone: func(_, _ string, err error) {
			if err != nil {
				r.dialing.Add(-1)
			}
		},
		TLSHandshakeDone: func(_ tls.ConnectionState, err error) {
			r.dialing.Add(-1)
			if err == nil && dialed != nil {
				dialed.Add(1)
			}
		},
	})
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
