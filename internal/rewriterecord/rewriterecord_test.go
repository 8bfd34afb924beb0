package rewriterecord

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

// TestWriteMerges: the first write creates the record, a later one adds its resources and
// replaces theirs, leaving the others; what is read back is what was written.
func TestWriteMerges(t *testing.T) {
	ctx := context.Background()
	client := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	at := time.Date(2026, 12, 4, 15, 0, 0, 0, time.UTC)
	if err := Write(ctx, client, map[string]Entry{"deviceclasses": {Server: "v1.36.3", Version: "v1", Objects: 1, Completed: at}}); err != nil {
		t.Fatal(err)
	}
	if err := Write(ctx, client, map[string]Entry{"resourceclaims": {Server: "v1.37.2", Version: "v1", Objects: 3, Completed: at}}); err != nil {
		t.Fatal(err)
	}
	if err := Write(ctx, client, map[string]Entry{"deviceclasses": {Server: "v1.37.2", Version: "v1", Objects: 2, Completed: at}}); err != nil {
		t.Fatal(err)
	}
	u, err := client.Resource(configMaps).Namespace(Namespace).Get(ctx, Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cm); err != nil {
		t.Fatal(err)
	}
	got, err := Decode(&cm)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Entry{
		"deviceclasses":  {Server: "v1.37.2", Version: "v1", Objects: 2, Completed: at},
		"resourceclaims": {Server: "v1.37.2", Version: "v1", Objects: 3, Completed: at},
	}
	if len(got) != len(want) {
		t.Fatalf("record %v, want %v", got, want)
	}
	for res, w := range want {
		if g := got[res]; g.Server != w.Server || g.Objects != w.Objects || !g.Completed.Equal(w.Completed) || g.Version != w.Version {
			t.Errorf("%s: %+v, want %+v", res, g, w)
		}
	}
}

// TestDecodeRefusesBadEntries: an entry that does not parse, or that is larger than an entry
// can be, is an error naming its key.
func TestDecodeRefusesBadEntries(t *testing.T) {
	for name, value := range map[string]string{
		"not json": "{",
		"too big":  `{"server":"` + strings.Repeat("v", maxEntryBytes) + `"}`,
	} {
		t.Run(name, func(t *testing.T) {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: Name}, Data: map[string]string{"resourceclaims": value}}
			if _, err := Decode(cm); err == nil || !strings.Contains(err.Error(), "data.resourceclaims") {
				t.Errorf("error %v, want one naming data.resourceclaims", err)
			}
		})
	}
}
