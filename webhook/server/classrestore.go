package server

import (
	"context"
	"encoding/json"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/webhook/podinject"
)

// fieldManager is the manager of the restored field in the classes' managedFields.
const fieldManager = "gpu-dra-webhook"

// classPatcher is the part of a DeviceClass client the restorer uses.
type classPatcher interface {
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*resourceapi.DeviceClass, error)
}

// classRestorer puts back the spec.extendedResourceName of the chart's DeviceClasses that an API
// server which did not serve DRA extended resources (1.34 and 1.35 with their defaults) dropped
// when the chart wrote them. After a control-plane upgrade that serves the field, the stored
// classes still lack it, so neither the scheduler nor the webhook (which reads the feature from the
// stored classes) would serve pods' resources.limits through DRA until a helm upgrade wrote the
// classes again. A dry-run merge patch of the one field is the probe (an API server that drops the
// field answers without it) and the same patch is the fix.
type classRestorer struct {
	classes []podinject.DeviceClass
	stored  func() []*resourceapi.DeviceClass
	patch   classPatcher

	mu sync.Mutex
	// latest are the classes as this process last restored them, logged once each.
	latest map[string]*resourceapi.DeviceClass
}

// restore patches each configured class whose stored copy has no extendedResourceName, and
// returns the classes the API server now stores with it. A class set to another name, or missing,
// is left alone: it is the administrator's or helm's.
func (r *classRestorer) restore(ctx context.Context) []*resourceapi.DeviceClass {
	logger := klog.FromContext(ctx)
	stored := map[string]*resourceapi.DeviceClass{}
	for _, dc := range r.stored() {
		stored[dc.Name] = dc
	}
	var out []*resourceapi.DeviceClass
	for _, c := range r.classes {
		dc, ok := stored[c.Name]
		if c.ExtendedResourceName == "" || !ok || ptr.Deref(dc.Spec.ExtendedResourceName, "") != "" {
			continue
		}
		patch, err := json.Marshal(map[string]any{"spec": map[string]any{"extendedResourceName": string(c.ExtendedResourceName)}})
		if err != nil {
			continue
		}
		// A dry run first: a real patch that the API server strips of the field would still record
		// this webhook as the field's manager, and helm's next server-side apply of the class
		// would conflict with it. Where the field is not served nothing is written.
		got, err := r.patch.Patch(ctx, c.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager, DryRun: []string{metav1.DryRunAll}})
		if err == nil && ptr.Deref(got.Spec.ExtendedResourceName, "") == string(c.ExtendedResourceName) {
			got, err = r.patch.Patch(ctx, c.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
		}
		switch {
		case apierrors.IsNotFound(err) || apierrors.IsForbidden(err):
			// resource.k8s.io/v1 not served (before 1.34, which has no such field), the class
			// deleted meanwhile, or a chart without the patch rule.
			logger.V(4).Info("Cannot restore a DeviceClass's extendedResourceName", "deviceClass", c.Name, "err", err)
			continue
		case err != nil:
			logger.V(2).Info("Restoring a DeviceClass's extendedResourceName failed; retrying at the next refresh", "deviceClass", c.Name, "err", err)
			continue
		case ptr.Deref(got.Spec.ExtendedResourceName, "") != string(c.ExtendedResourceName):
			continue // not served: the API server dropped it again and stored nothing
		}
		out = append(out, got)
		r.mu.Lock()
		_, seen := r.latest[c.Name]
		first := !seen
		if r.latest == nil {
			r.latest = map[string]*resourceapi.DeviceClass{}
		}
		r.latest[c.Name] = got
		r.mu.Unlock()
		if first {
			logger.Info("Restored the extendedResourceName of a DeviceClass, which an API server that did not serve it had dropped",
				"deviceClass", c.Name, "extendedResourceName", c.ExtendedResourceName)
		}
	}
	return out
}

// list is the stored classes, with those this process restored in place of stored copies that
// still lack the field: the informer sees a patch a moment after its answer, and until then the
// feature must not read as gone again.
func (r *classRestorer) list() []*resourceapi.DeviceClass {
	stored := r.stored()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.latest) == 0 {
		return stored
	}
	out := make([]*resourceapi.DeviceClass, 0, len(stored))
	for _, dc := range stored {
		if got, ok := r.latest[dc.Name]; ok && ptr.Deref(dc.Spec.ExtendedResourceName, "") == "" {
			dc = got
		}
		out = append(out, dc)
	}
	return out
}
