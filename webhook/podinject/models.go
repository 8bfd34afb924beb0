package podinject

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// subRequestPrefix names the subrequests of a list of models: model-0 is the first model, so a
// claim's result request gpus/model-1 says the second was allocated.
const subRequestPrefix = "model-"

// parseModels reads a model annotation with commas: models to try in the order given, blanks
// around each forgiven, 2..firstAvailable's limit of them, none empty or twice. A single model is
// not a list: parseRequest takes it as written, as it always has.
func parseModels(key, value string) ([]string, field.ErrorList) {
	const example = `e.g. "A100,LATEST-GPU-MODEL"`
	if n := strings.Count(value, ",") + 1; n > resourceapi.FirstAvailableDeviceRequestMaxSize {
		return nil, field.ErrorList{invalid(key, value, fmt.Sprintf("lists %d models, and a request tries at most %d in turn; list fewer", n, resourceapi.FirstAvailableDeviceRequestMaxSize))}
	}
	var models []string
	var errs field.ErrorList
	position := 0
	for model := range strings.SplitSeq(value, ",") {
		position++
		model = strings.TrimSpace(model)
		switch {
		case model == "":
			errs = append(errs, invalid(key, value, fmt.Sprintf("model %d of the list is empty; list models separated by commas, %s", position, example)))
		case len(model) > resourceapi.DeviceAttributeMaxValueLength:
			errs = append(errs, invalid(key, value, fmt.Sprintf("model %d is longer than %d bytes, so no device can publish it; use models exactly as the ResourceSlice shows them", position, resourceapi.DeviceAttributeMaxValueLength)))
		case slices.Contains(models, model):
			errs = append(errs, invalid(key, value, fmt.Sprintf("model %q is listed twice; list each model once, in the order to try them", shorten(model))))
		default:
			models = append(models, model)
		}
	}
	if len(errs) == 0 && len(models) < 2 {
		errs = append(errs, invalid(key, value, fmt.Sprintf("a list needs two models or more; name one model without commas, or list several, %s", example)))
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return models, nil
}

// prioritizedListServed answers a pod whose model annotation lists several models on a cluster
// that drops firstAvailable (before 1.34 by default): the claim would have no request at all.
// served is true when the request can go on.
func (h *Handler) prioritizedListServed(ctx context.Context, pod *podView, want Request) (resp admission.Response, served bool) {
	if len(want.Models) == 0 {
		return admission.Response{}, true
	}
	if h.opts.cluster != nil {
		ok, err := h.opts.cluster.ServesPrioritizedList(ctx)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Cannot tell whether the API server serves firstAvailable")
			return admission.Errored(http.StatusServiceUnavailable, fmt.Errorf("cannot tell whether the cluster serves firstAvailable for the models of annotation %s: %w", h.opts.annotation(annModel), err)), false
		}
		if ok {
			return admission.Response{}, true
		}
	}
	key := h.opts.annotation(annModel)
	return denied(pod, field.ErrorList{invalid(key, strings.Join(want.Models, ","), fmt.Sprintf(
		"this cluster does not serve firstAvailable (feature gate DRAPrioritizedList, on by default from Kubernetes 1.34), so a pod cannot try models in turn; name one model, e.g. %q", want.Models[0]))}), false
}

// memoryShare decides whether a memory annotation asks for a share (want.MemoryShare): where the
// cluster serves consumable capacity and firstAvailable and the driver publishes shared-memory
// GPUs. Elsewhere, and when the cluster cannot be asked, it stays the least-memory selector it
// has always been. ok is false with the denial of a list of models too long to try each as a
// share and whole.
func (h *Handler) memoryShare(ctx context.Context, pod *podView, want *Request) (resp admission.Response, ok bool) {
	if want.Memory == nil || h.opts.cluster == nil {
		return admission.Response{}, true
	}
	shares, err := h.opts.cluster.SharesMemory(ctx)
	if err == nil && shares {
		shares, err = h.opts.cluster.ServesPrioritizedList(ctx)
	}
	if err != nil {
		klog.FromContext(ctx).Info("Cannot tell whether GPUs' memory can be shared; the memory annotation selects whole GPUs", "err", err)
		return admission.Response{}, true
	}
	if !shares {
		return admission.Response{}, true
	}
	if max := resourceapi.FirstAvailableDeviceRequestMaxSize / 2; len(want.Models) > max {
		key := h.opts.annotation(annModel)
		return denied(pod, field.ErrorList{invalid(key, strings.Join(want.Models, ","), fmt.Sprintf(
			"with %s on a cluster of shared-memory GPUs each model is tried as a share and whole, and a request tries at most %d alternatives; list at most %d models",
			h.opts.annotation(annMemory), resourceapi.FirstAvailableDeviceRequestMaxSize, max))}), false
	}
	want.MemoryShare = true
	return admission.Response{}, true
}
