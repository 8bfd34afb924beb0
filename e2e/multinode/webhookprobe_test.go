package multinode

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// probeTimeout bounds one ask: the webhook's own timeout is 5 s, so longer means the API server hung.
const probeTimeout = 15 * time.Second

// webhookProbe asks the webhook at a steady rate about the seed's template with a typo in its
// selector, which only the webhook denies: an answer is its denial, anything else (admitted, or
// the API server failing to call it) is not. Each ask runs on its own (open loop): one that hangs
// does not slow the others.
type webhookProbe struct {
	mu         sync.Mutex
	answers    []error
	quit, done chan struct{}
}

// askWebhook asks every `every` with a dry-run create in ns until stop.
func askWebhook(t *testing.T, c *framework.Cluster, ns string, every time.Duration) *webhookProbe {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var typo resourcev1.ResourceClaimTemplate
	if err := yaml.UnmarshalStrict([]byte(strings.Replace(string(raw), ".model ==", ".modle ==", 1)), &typo); err != nil {
		t.Fatal(err)
	}
	typo.Name = "example-typo"
	// A client of its own: client-go's default rate limit (5 per second) would queue the asks.
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	templates := kubernetes.NewForConfigOrDie(cfg).ResourceV1().ResourceClaimTemplates(ns)
	w := &webhookProbe{quit: make(chan struct{}), done: make(chan struct{})}
	ask := func() {
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		defer cancel()
		_, err := templates.Create(ctx, typo.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case err == nil:
			err = errors.New("admitted the template with a typo")
		case strings.Contains(err.Error(), "denied the request"):
			err = nil
		}
		w.mu.Lock()
		w.answers = append(w.answers, err)
		w.mu.Unlock()
	}
	go func() {
		defer close(w.done)
		var asks sync.WaitGroup
		defer asks.Wait()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			asks.Go(ask)
			select {
			case <-w.quit:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// answering: the last ten answers were all the webhook's.
func (w *webhookProbe) answering() (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(w.answers)
	if n < 10 {
		return false, nil
	}
	for _, err := range w.answers[n-10:] {
		if err != nil {
			return false, err
		}
	}
	return true, nil
}

// stop waits for the asks in flight and returns the answers that were not the webhook's and how
// many were asked.
func (w *webhookProbe) stop() (failed []error, asked int) {
	close(w.quit)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, err := range w.answers {
		if err != nil {
			failed = append(failed, err)
		}
	}
	return failed, len(w.answers)
}
