package app

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	drahealth "github.com/gpu-dra/gpu-dra/driver/faults"
)

// longNode is a node name of 253 characters: its ConfigMap's name is shortened.
var longNode = strings.Repeat("n", 60) + "." + strings.Repeat("o", 60) + "." + strings.Repeat("d", 60) + "." + strings.Repeat("e", 70)

// TestFaultObjects sets and clears faults through a fake API server: each node's faults are in
// their own ConfigMap, labelled and owned by the chart's, created with the first fault and
// deleted with the last; other nodes' are untouched; the chart's stays empty; `fault list` (a
// golden file) shows them all and notes an object that is no node's, and ignores the entries of
// the chart's ConfigMap.
func TestFaultObjects(t *testing.T) {
	ctx := context.Background()
	anchor := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gpu-dra-faults", Namespace: "gpu-dra", UID: "anchor-uid"},
		Data: map[string]string{"las3": "gpu-0: {kind: xid, time: \"2026-12-03T10:00:00Z\"}"}} // as an earlier version wrote it
	cs := fake.NewClientset(anchor)
	for _, node := range []string{"las1", "las2", longNode} {
		slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node[:4] + "-gpu"}, Spec: resourceapi.ResourceSliceSpec{
			Driver: "gpu.example.com", NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "gpu-0"}, {Name: "gpu-1"}, {Name: "gpu-3"}}}}
		if _, err := cs.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	o := &faultOptions{streams: genericiooptions.IOStreams{Out: &out, ErrOut: &out}, namespace: "gpu-dra", configMap: "gpu-dra-faults", driverName: "gpu.example.com"}
	at := func(minute int) drahealth.Fault {
		return drahealth.Fault{Kind: drahealth.KindXID, Time: metav1.NewTime(time.Date(2026, 12, 4, 10, minute, 0, 0, time.UTC)), Message: "XID 79"}
	}
	apply := func(node, dev string, fault drahealth.Fault, set bool) {
		t.Helper()
		if err := o.apply(ctx, cs, node, dev, fault, set); err != nil {
			t.Fatalf("%s/%s: %v", node, dev, err)
		}
	}
	object := func(node string) *corev1.ConfigMap {
		cm, err := cs.CoreV1().ConfigMaps("gpu-dra").Get(ctx, drahealth.ObjectName("gpu-dra-faults", node), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return cm
	}

	apply("las1", "gpu-3", at(0), true)
	apply("las1", "gpu-1", at(1), true)
	apply("las2", "gpu-0", at(2), true)
	las1 := object("las1")
	if las1 == nil || las1.Name != "gpu-dra-faults-las1" {
		t.Fatalf("las1's ConfigMap: %v", las1)
	}
	if got := las1.Labels; got["app.kubernetes.io/part-of"] != "gpu-dra-faults" || got["app.kubernetes.io/component"] != "faults" {
		t.Errorf("las1's ConfigMap has the labels %v", got)
	}
	if refs := las1.OwnerReferences; len(refs) != 1 || refs[0].UID != "anchor-uid" || refs[0].Kind != "ConfigMap" {
		t.Errorf("las1's ConfigMap has the owners %v, want the chart's ConfigMap", refs)
	}
	if len(las1.Data) != 1 || !strings.Contains(las1.Data["las1"], "gpu-1:") || !strings.Contains(las1.Data["las1"], "gpu-3:") {
		t.Errorf("las1's ConfigMap holds %v", las1.Data)
	}
	if _, err := cs.CoreV1().ConfigMaps("gpu-dra").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "stray", Namespace: "gpu-dra",
		Labels: map[string]string{"app.kubernetes.io/part-of": "gpu-dra-faults", "app.kubernetes.io/component": "faults"}}, Data: map[string]string{"las9": ""}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := o.printList(ctx, cs); err != nil {
		t.Fatal(err)
	}
	golden(t, filepath.Join("testdata", "fault", "list"), out.String())

	apply(longNode, "gpu-0", at(3), true)
	if cm := object(longNode); cm == nil || len(cm.Name) > 253 {
		t.Errorf("the long node's ConfigMap: %v", cm)
	}
	out.Reset()
	if err := o.printList(ctx, cs); err != nil || !strings.Contains(out.String(), longNode+"  gpu-0") {
		t.Errorf("list does not show the long node's fault (%v):\n%s", err, out.String())
	}

	apply("las1", "gpu-3", drahealth.Fault{}, false)
	if cm := object("las1"); cm == nil || strings.Contains(cm.Data["las1"], "gpu-3") || !strings.Contains(cm.Data["las1"], "gpu-1") {
		t.Errorf("after clearing gpu-3, las1's ConfigMap is %v", cm)
	}
	apply("las1", "gpu-1", drahealth.Fault{}, false)
	if cm := object("las1"); cm != nil {
		t.Errorf("las1's ConfigMap is left after its last fault was cleared: %v", cm.Data)
	}
	apply("las1", "gpu-1", drahealth.Fault{}, false)
	if cm := object("las1"); cm != nil {
		t.Error("clearing a healthy device created a ConfigMap")
	}
	if cm := object("las2"); cm == nil || !strings.Contains(cm.Data["las2"], "gpu-0") {
		t.Errorf("las2's ConfigMap changed with las1's: %v", cm)
	}
	if cm, _ := cs.CoreV1().ConfigMaps("gpu-dra").Get(ctx, "gpu-dra-faults", metav1.GetOptions{}); len(cm.Data) != 1 {
		t.Errorf("the chart's ConfigMap was written: %v", cm.Data)
	}
}

func TestFaultOptionsRefuse(t *testing.T) {
	ctx := context.Background()
	var out bytes.Buffer
	o := &faultOptions{streams: genericiooptions.IOStreams{Out: &out, ErrOut: &out}, namespace: "gpu-dra", configMap: "gpu-dra-faults"}
	for name, tc := range map[string]struct {
		run  func() error
		want string
	}{
		"list without the release": {func() error { return o.printList(ctx, fake.NewClientset()) },
			"ConfigMap gpu-dra/gpu-dra-faults not found: install the chart with health.simulatedFaults=true"},
		"set without the release": {func() error { return o.apply(ctx, fake.NewClientset(), "las1", "gpu-0", drahealth.Fault{}, true) },
			"ConfigMap gpu-dra/gpu-dra-faults not found"},
		"base too long": {func() error { o := *o; o.configMap = strings.Repeat("f", 64); return o.run(ctx, "las1/gpu-0", false) },
			"--configmap: \"fff"},
	} {
		if err := tc.run(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", name, err, tc.want)
		}
	}
}
