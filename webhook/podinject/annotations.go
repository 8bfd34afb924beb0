package podinject

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

// Request is what a pod's annotations ask for.
type Request struct {
	// Count is the number of GPUs, 1..the most a node holds.
	Count int
	// Model, when set, is the exact model every GPU must publish.
	Model string
	// Memory, when set, is the least memory capacity of every GPU.
	Memory *resource.Quantity
}

// maxShownValue keeps messages readable when someone pastes a novel into an annotation.
const maxShownValue = 64

var annotationsPath = field.NewPath("metadata", "annotations")

// parseRequest reads the count, model and memory annotations. The count annotation must be present
// (the caller checked). Every bad value is reported, not just the first.
func (o options) parseRequest(annotations map[string]string) (Request, field.ErrorList) {
	var req Request
	var errs field.ErrorList

	key := o.annotation(annCount)
	value := annotations[key]
	n, err := o.parseCount(value)
	if err != nil {
		errs = append(errs, invalid(key, value, err.Error()))
	}
	req.Count = n

	key = o.annotation(annModel)
	if value, ok := annotations[key]; ok {
		switch {
		case value == "":
			errs = append(errs, invalid(key, value, fmt.Sprintf("empty; name a model such as %q, or remove the annotation for any model", deviceschema.DefaultModel)))
		case !utf8.ValidString(value):
			errs = append(errs, invalid(key, value, "not valid UTF-8; use the model exactly as the ResourceSlice shows it"))
		case len(value) > resourceapi.DeviceAttributeMaxValueLength:
			errs = append(errs, invalid(key, value, fmt.Sprintf("longer than %d bytes, so no device can publish it; use the model exactly as the ResourceSlice shows it", resourceapi.DeviceAttributeMaxValueLength)))
		default:
			req.Model = value
		}
	}

	key = o.annotation(annMemory)
	if value, ok := annotations[key]; ok {
		q, err := resource.ParseQuantity(strings.TrimSpace(value))
		switch {
		case err != nil:
			errs = append(errs, invalid(key, value, "not a quantity; use the least memory per GPU, e.g. 40Gi"))
		case q.Sign() <= 0:
			errs = append(errs, invalid(key, value, "must be positive; use the least memory per GPU, e.g. 40Gi"))
		default:
			req.Memory = &q
		}
	}
	return req, errs
}

// parseCount accepts "1".."limit", surrounding blanks forgiven.
func (o options) parseCount(value string) (int, error) {
	limit := o.countLimit()
	use := fmt.Sprintf("use 1..%d", limit)
	s := strings.TrimSpace(value)
	n, err := strconv.Atoi(s)
	switch {
	case errors.Is(err, strconv.ErrRange) && strings.HasPrefix(s, "-"):
		return 0, fmt.Errorf("negative; %s", use)
	case errors.Is(err, strconv.ErrRange):
		return 0, fmt.Errorf("more than any node of driver %s has (%d); %s", o.driverName, o.maxPerNode, use)
	case err != nil:
		return 0, fmt.Errorf("not a whole number of GPUs; %s", use)
	case n < 0:
		return 0, fmt.Errorf("negative; %s", use)
	case n == 0:
		return 0, fmt.Errorf("a pod asking for GPUs needs at least 1; %s, or remove the annotation", use)
	case n > o.maxPerNode:
		return 0, fmt.Errorf("more than any node of driver %s has (%d); %s", o.driverName, o.maxPerNode, use)
	case n > limit:
		return 0, fmt.Errorf("more than one claim can allocate (%d); %s", resourceapi.AllocationResultsMaxSize, use)
	}
	return n, nil
}

// chosenContainers returns the indexes of the app containers that get the GPUs: those the
// containers annotation names, or all of them. Init containers never get them: they run before the
// app and would hold the devices for nothing.
func (o options) chosenContainers(pod *podView) ([]int, field.ErrorList) {
	key := o.annotation(annContainers)
	value, ok := pod.Metadata.Annotations[key]
	if !ok {
		all := make([]int, len(pod.Spec.Containers))
		for i := range all {
			all[i] = i
		}
		return all, nil
	}
	appNames := make([]string, len(pod.Spec.Containers))
	for i, c := range pod.Spec.Containers {
		appNames[i] = c.Name
	}
	these := "its containers are: " + strings.Join(appNames, ", ")

	var chosen []int
	var errs field.ErrorList
	for name := range strings.SplitSeq(value, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if i := slices.Index(appNames, name); i >= 0 {
			if !slices.Contains(chosen, i) {
				chosen = append(chosen, i)
			}
			continue
		}
		if slices.ContainsFunc(pod.Spec.InitContainers, func(c containerView) bool { return c.Name == name }) {
			errs = append(errs, invalid(key, value, fmt.Sprintf("%q is an init container; GPUs go to app containers only; %s", name, these)))
			continue
		}
		errs = append(errs, invalid(key, value, fmt.Sprintf("no container %q in this pod; %s", shorten(name), these)))
	}
	if len(chosen) == 0 && len(errs) == 0 {
		errs = append(errs, invalid(key, value, "names no container; list app containers separated by commas, or remove the annotation to give GPUs to all; "+these))
	}
	slices.Sort(chosen)
	return chosen, errs
}

// unknownAnnotations warns about keys under the prefix that nothing reads: a typo such as
// "memroy" would otherwise silently give the pod GPUs of any size.
func (o options) unknownAnnotations(annotations map[string]string) []string {
	var warnings []string
	prefix := o.driverName + "/"
	for key := range annotations {
		suffix, ok := strings.CutPrefix(key, prefix)
		if !ok {
			continue
		}
		switch suffix {
		case annCount, annModel, annMemory, annContainers:
			continue
		}
		warnings = append(warnings, fmt.Sprintf("annotation %s is ignored: the GPU webhook reads only %s, %s, %s and %s",
			shorten(key), o.annotation(annCount), o.annotation(annModel), o.annotation(annMemory), o.annotation(annContainers)))
	}
	slices.Sort(warnings)
	return warnings
}

func invalid(key, value, detail string) *field.Error {
	return field.Invalid(annotationsPath.Key(key), shorten(value), detail)
}

func shorten(s string) string {
	if len(s) <= maxShownValue {
		return s
	}
	cut := maxShownValue
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
