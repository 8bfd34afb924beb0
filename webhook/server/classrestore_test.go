package server

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/webhook/podinject"
)

// droppingServer answers merge patches of extendedResourceName like an API server that serves the
// field (keeps it) or not (drops it), and records the patches (a dry run's as "dry-run NAME").
type droppingServer struct {
	serves  bool
	err     error
	patched []string
}

func (s *droppingServer) Patch(_ context.Context, name string, pt types.PatchType, data []byte, o metav1.PatchOptions, _ ...string) (*resourceapi.DeviceClass, error) {
	if len(o.DryRun) > 0 {
		name = "dry-run " + name
	}
	s.patched = append(s.patched, name)
	if s.err != nil {
		return nil, s.err
	}
	if pt != types.MergePatchType {
		return nil, apierrors.NewBadRequest("want a merge patch")
	}
	var p struct {
		Spec struct {
			ExtendedResourceName string `json:"extendedResourceName"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, err
	}
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "2"}}
	if s.serves {
		dc.Spec.ExtendedResourceName = ptr.To(p.Spec.ExtendedResourceName)
	}
	return dc, nil
}

func storedClass(name, extended string) *resourceapi.DeviceClass {
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"}}
	if extended != "" {
		dc.Spec.ExtendedResourceName = ptr.To(extended)
	}
	return dc
}

// TestClassRestorer: a configured class stored without its extendedResourceName is patched; the
// API server keeping it restores it (said once, however many rounds), dropping it restores
// nothing; a class stored with any name, one without an extended resource, a missing one and a
// refused patch are left alone.
func TestClassRestorer(t *testing.T) {
	configured := []podinject.DeviceClass{
		{Name: "gpu.example.com", ExtendedResourceName: "gpu.example.com/gpu"},
		{Name: "set.example.com", ExtendedResourceName: "set.example.com/gpu"},
		{Name: "plain.example.com"},
		{Name: "missing.example.com", ExtendedResourceName: "missing.example.com/gpu"},
	}
	stored := []*resourceapi.DeviceClass{storedClass("gpu.example.com", ""), storedClass("set.example.com", "other.example.com/gpu"),
		storedClass("plain.example.com", ""), storedClass("user.example.com", "")}
	dry, real := "dry-run gpu.example.com", "gpu.example.com"
	for _, tc := range []struct {
		name     string
		server   droppingServer
		restored bool
		// patched are the patches of each of the three rounds: nothing is written where the dry
		// run shows the field dropped or the patch refused.
		patched []string
	}{
		{name: "served", server: droppingServer{serves: true}, restored: true, patched: []string{dry, real}},
		{name: "dropped", server: droppingServer{}, patched: []string{dry}},
		{name: "forbidden", server: droppingServer{err: apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}, "gpu.example.com", nil)}, patched: []string{dry}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			ctx := klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&logs))))
			r := &classRestorer{classes: configured, stored: func() []*resourceapi.DeviceClass { return stored }, patch: &tc.server}
			for range 3 {
				got := r.restore(ctx)
				if (len(got) == 1) != tc.restored {
					t.Fatalf("restored %d classes, want restored: %v", len(got), tc.restored)
				}
			}
			if want := slices.Concat(tc.patched, tc.patched, tc.patched); strings.Join(tc.server.patched, ",") != strings.Join(want, ",") {
				t.Errorf("patched %v, want %v", tc.server.patched, want)
			}
			if n := strings.Count(logs.String(), "Restored the extendedResourceName"); (n == 1) != tc.restored || n > 1 {
				t.Errorf("logged the restore %d times, want once if restored (%v):\n%s", n, tc.restored, logs.String())
			}
			// The list answers with the restored copy until the informer catches up.
			listed := map[string]string{}
			for _, dc := range r.list() {
				listed[dc.Name] = ptr.Deref(dc.Spec.ExtendedResourceName, "")
			}
			if want := map[bool]string{true: "gpu.example.com/gpu"}[tc.restored]; listed["gpu.example.com"] != want || listed["set.example.com"] != "other.example.com/gpu" || len(listed) != 4 {
				t.Errorf("list: %v, want gpu.example.com with %q and the rest as stored", listed, want)
			}
		})
	}
}
