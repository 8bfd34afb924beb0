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
	"github.com/gpu-dra/gpu-dra/internal/quantity"
)

// Request is what a pod's annotations ask for.
type Request struct {
	// Count is the number of GPUs, 1..the most a node holds.
	Count int
	// Model, when set, is the exact model every GPU must publish.
	Model string
	// Models, when set instead of Model, are models to try in turn (firstAvailable): the GPUs
	// are all of the first model that can be allocated.
	Models []string
	// Memory, when set, is the least memory capacity of every GPU.
	Memory *resource.Quantity
	// MemoryShare: the cluster serves consumable capacity and the driver publishes shared-memory
	// GPUs, so Memory is also a share of one (see options.template). Not an annotation: the
	// handler decides it.
	MemoryShare bool
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
		case strings.Contains(value, ","):
			var merrs field.ErrorList
			req.Models, merrs = parseModels(key, value)
			errs = append(errs, merrs...)
		case len(value) > resourceapi.DeviceAttributeMaxValueLength:
			errs = append(errs, invalid(key, value, fmt.Sprintf("longer than %d bytes, so no device can publish it; use the model exactly as the ResourceSlice shows it", resourceapi.DeviceAttributeMaxValueLength)))
		default:
			req.Model = value
		}
	}

	key = o.annotation(annMemory)
	if value, ok := annotations[key]; ok {
		q, err := quantity.Parse(strings.TrimSpace(value))
		switch {
		case errors.Is(err, quantity.ErrSyntax):
			errs = append(errs, invalid(key, value, "not a quantity; use the least memory per GPU, e.g. 40Gi"))
		case err != nil:
			errs = append(errs, invalid(key, value, err.Error()+"; write a plain quantity of the least memory per GPU, e.g. 40Gi"))
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
// app and would hold the devices for nothing. Wrong names are reported in at most two errors (unknown
// names, init containers), each listing the names once and at most maxListed of them: the cost of
// a denial must not grow with the product of the names and the containers.
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
	app, isInit := containerIndex(pod.Spec.Containers), containerIndex(pod.Spec.InitContainers)
	var chosen []int
	var unknown, init []string
	var seen map[string]bool // wrong names already reported; allocated on the first one
	for name := range strings.SplitSeq(value, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if i := app(name); i >= 0 {
			if !slices.Contains(chosen, i) {
				chosen = append(chosen, i)
			}
			continue
		}
		if seen[name] {
			continue
		}
		if seen == nil {
			seen = map[string]bool{}
		}
		seen[name] = true
		if isInit(name) >= 0 {
			init = append(init, name)
		} else {
			unknown = append(unknown, name)
		}
	}
	var errs field.ErrorList
	if len(init) > 0 {
		what := "is an init container"
		if len(init) > 1 {
			what = "are init containers"
		}
		errs = append(errs, invalid(key, value, fmt.Sprintf("%s %s; GPUs go to app containers only; %s", listNames(init, true), what, appContainers(pod))))
	}
	if len(unknown) > 0 {
		what := "no container"
		if len(unknown) > 1 {
			what = "no containers"
		}
		errs = append(errs, invalid(key, value, fmt.Sprintf("%s %s in this pod; %s", what, listNames(unknown, true), appContainers(pod))))
	}
	if len(chosen) == 0 && len(errs) == 0 {
		errs = append(errs, invalid(key, value, "names no container; list app containers separated by commas, or remove the annotation to give GPUs to all; "+appContainers(pod)))
	}
	slices.Sort(chosen)
	return chosen, errs
}

// containerIndex returns a lookup of a container's index by name, -1 for none. Pods have a few
// containers, which a scan finds fastest; a map keeps a forged pod with thousands of them, named
// thousands of times, linear.
func containerIndex(containers []containerView) func(name string) int {
	if len(containers) <= 8 {
		return func(name string) int {
			return slices.IndexFunc(containers, func(c containerView) bool { return c.Name == name })
		}
	}
	index := make(map[string]int, len(containers))
	for i := len(containers) - 1; i >= 0; i-- { // the first of equal names wins, as in a scan
		index[containers[i].Name] = i
	}
	return func(name string) int {
		if i, ok := index[name]; ok {
			return i
		}
		return -1
	}
}

// maxListed is how many names a message lists before it says how many more there are.
const maxListed = 10

// appContainers names the pod's app containers for a message.
func appContainers(pod *podView) string {
	names := make([]string, len(pod.Spec.Containers))
	for i, c := range pod.Spec.Containers {
		names[i] = c.Name
	}
	return "its containers are: " + listNames(names, false)
}

// listNames lists at most maxListed names, each shortened, quoted or not, then how many more.
func listNames(names []string, quote bool) string {
	var b strings.Builder
	for i, n := range names[:min(len(names), maxListed)] {
		if i > 0 {
			b.WriteString(", ")
		}
		if quote {
			b.WriteString(strconv.Quote(shorten(n)))
		} else {
			b.WriteString(shorten(n))
		}
	}
	if len(names) > maxListed {
		fmt.Fprintf(&b, " and %d more", len(names)-maxListed)
	}
	return b.String()
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

// shorten cuts s after the runes whose quoted form takes at most maxShownValue bytes: messages
// quote values, and a byte that is not UTF-8 quotes as four (\xNN), so a cut by raw length let
// binary values and names grow a message fourfold.
func shorten(s string) string {
	n := 0
	for i := 0; i < len(s); {
		r, w := utf8.DecodeRuneInString(s[i:])
		q := 4 // \xNN
		if r != utf8.RuneError || w != 1 {
			q = len(strconv.QuoteRune(r)) - 2
		}
		if n+q > maxShownValue {
			return s[:i] + "..."
		}
		n += q
		i += w
	}
	return s
}
