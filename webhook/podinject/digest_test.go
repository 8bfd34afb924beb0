package podinject

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// labelledTemplate is a template that claims the managed-by label, about size bytes large: a
// long annotation and long CEL selectors, as the API server accepts them.
func labelledTemplate(ns, name string, size int) *resourceapi.ResourceClaimTemplate {
	const selectors, selectorSize = 4, 8 << 10
	t := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels:      map[string]string{ManagedByLabel: ManagedBy},
			Annotations: map[string]string{"example.com/padding": strings.Repeat("x", size-selectors*selectorSize)},
		},
	}
	exactly := &resourceapi.ExactDeviceRequest{DeviceClassName: "other.example.com", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
	for range selectors {
		exactly.Selectors = append(exactly.Selectors, celSelector(fmt.Sprintf("%q == device.driver", strings.Repeat("y", selectorSize-20))))
	}
	t.Spec.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "other", Exactly: exactly}}
	return t
}

// checkLabelledTemplatesCostNothing: anyone who may create a template can put the managed-by label
// on it, on templates of other drivers too, which never reach this webhook. The informer keeps
// nothing of those that are not named as the webhook names its templates, and of those that are
// only a few hundred bytes, however large they are; the webhook still reuses its own, refuses an
// impostor and creates what is missing. Shared by the unit test (fake clientset) and the
// integration test (real API server, every served version).
func checkLabelledTemplatesCostNothing(t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	const (
		foreign = 40
		size    = 128 << 10
		// maxKept is what the informer may keep of one template: its key and a digest.
		maxKept = 512
	)
	ctx := context.Background()
	templates := NewAPIClient(cs).templates(ns)
	var names []string
	for i := range foreign {
		// Other drivers' names, and names that come close to the webhook's.
		name := []string{"other-driver-%d", "gpu-dra-%d", "gpu-dra-1-abcdefg12%d", "gpu-dra-1-abcdef0123-%d"}[i%4]
		names = append(names, fmt.Sprintf(name, i))
		if _, err := templates.Create(ctx, labelledTemplate(ns, names[i], size), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ours := testTemplate(t, ns)
	if _, err := templates.Create(ctx, ours, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// An impostor under a managed name, as large as the others.
	wantImpostor := templateFor(t, ns, 3)
	impostor := labelledTemplate(ns, wantImpostor.Name, size)
	if _, err := templates.Create(ctx, impostor, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var before, after runtime.MemStats
	heap(&before)
	c := runAPIClient(t, NewAPIClient(cs))
	heap(&after)

	var kept []string
	keptBytes := 0
	for _, obj := range c.managed.cache.List() {
		m, err := meta.Accessor(obj)
		if err != nil {
			t.Fatal(err)
		}
		if m.GetNamespace() != ns {
			continue
		}
		kept = append(kept, m.GetName())
		data, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		keptBytes += len(data)
		if len(data) > maxKept {
			t.Errorf("the informer keeps %d bytes of %s, want at most %d", len(data), m.GetName(), maxKept)
		}
	}
	slices.Sort(kept)
	want := []string{ours.Name, impostor.Name}
	slices.Sort(want)
	if !slices.Equal(kept, want) {
		t.Errorf("the informer keeps templates %q of namespace %s, want only those named as the webhook names them %q", kept, ns, want)
	}
	// The templates weigh foreign×size (5 MiB); what the informer keeps of them is bytes.
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d labelled templates of %d bytes: the heap grew by %d bytes, the informer keeps %d bytes (JSON) of namespace %s", foreign+2, size, grown, keptBytes, ns)
	if grown > foreign*size/8 {
		t.Errorf("the heap grew by %d bytes listing %d labelled templates of %d bytes each, want at most %d", grown, foreign, size, foreign*size/8)
	}

	if err := c.EnsureTemplate(ctx, ours); err != nil {
		t.Errorf("existing managed template: %v", err)
	}
	var refused *RefusedError
	if err := c.EnsureTemplate(ctx, wantImpostor); !errors.As(err, &refused) {
		t.Errorf("impostor under a managed name: %v, want it refused", err)
	}
	missing := templateFor(t, ns, 4)
	if err := c.EnsureTemplate(ctx, missing); err != nil {
		t.Errorf("missing managed template: %v", err)
	}
	if got, err := templates.Get(ctx, missing.Name, metav1.GetOptions{}); err != nil || got.Labels[ManagedByLabel] != ManagedBy {
		t.Errorf("created template %s: %+v (%v)", missing.Name, got, err)
	}
}

// heap reads the live heap: twice collected, so that pooled buffers (encoding/json's) are gone.
func heap(m *runtime.MemStats) {
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(m)
}

func TestLabelledTemplatesCostNothing(t *testing.T) {
	checkLabelledTemplatesCostNothing(t, decodingClientset(), "ns")
}

// decodingClientset is a fake clientset whose template lists are decoded afresh, as from the wire:
// the fake's own copies share their strings with what it stores, which would hide what the
// informer keeps.
func decodingClientset() *fake.Clientset {
	cs := fake.NewClientset()
	react := k8stesting.ObjectReaction(cs.Tracker())
	cs.PrependReactor("list", "resourceclaimtemplates", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		handled, obj, err := react(a)
		if !handled || err != nil {
			return handled, obj, err
		}
		data, err := json.Marshal(obj)
		if err != nil {
			return true, nil, err
		}
		out := &resourceapi.ResourceClaimTemplateList{}
		return true, out, json.Unmarshal(data, out)
	})
	return cs
}

// TestListDigestsInPages: the informer's list reads pages of templatePageSize at the latest
// resourceVersion, following the continue token, and keeps only the templates the webhook can
// have made.
func TestListDigestsInPages(t *testing.T) {
	const total = 2*templatePageSize + 3
	var all []resourceapi.ResourceClaimTemplate
	var want []string
	for i := range total {
		if i%2 == 0 {
			all = append(all, *labelledTemplate("ns", fmt.Sprintf("other-%d", i), 64<<10))
			continue
		}
		tmpl := templateFor(t, "ns", i)
		all = append(all, *tmpl)
		want = append(want, tmpl.Name)
	}
	var calls []metav1.ListOptions
	list := func(_ context.Context, opts metav1.ListOptions) (*resourceapi.ResourceClaimTemplateList, error) {
		calls = append(calls, opts)
		start := 0
		if opts.Continue != "" {
			start, _ = strconv.Atoi(opts.Continue)
		}
		end := min(start+int(opts.Limit), len(all))
		page := &resourceapi.ResourceClaimTemplateList{Items: all[start:end], ListMeta: metav1.ListMeta{ResourceVersion: "7"}}
		if end < len(all) {
			page.Continue = strconv.Itoa(end)
		}
		return page, nil
	}
	got, err := listDigests(context.Background(), metav1.ListOptions{ResourceVersion: "0", LabelSelector: "a=b"}, list)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 3 {
		t.Errorf("%d list calls for %d templates, want 3 pages of %d", len(calls), total, templatePageSize)
	}
	for i, c := range calls {
		if c.Limit != templatePageSize || c.ResourceVersion != "" || c.LabelSelector != "a=b" || (i > 0) != (c.Continue != "") {
			t.Errorf("list call %d: %+v", i, c)
		}
	}
	var names []string
	for _, d := range got.Items {
		names = append(names, d.Name)
		if len(d.Labels)+len(d.Annotations) != 0 {
			t.Errorf("digest of %s keeps metadata: %+v", d.Name, d.ObjectMeta)
		}
	}
	if !slices.Equal(names, want) || got.ResourceVersion != "7" {
		t.Errorf("listed %q at %q, want %q at 7", names, got.ResourceVersion, want)
	}
}
