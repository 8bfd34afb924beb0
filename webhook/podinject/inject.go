package podinject

import (
	"fmt"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	sigsjson "sigs.k8s.io/json"
)

// podView is the part of a pod the handler reads. Decoding only this, instead of a full
// corev1.Pod, keeps the admission path to one cheap JSON pass; Resources is a pointer so that a
// container without a resources object is told apart from one with an empty object, which the
// patch paths depend on.
type podView struct {
	Metadata struct {
		Name         string            `json:"name"`
		GenerateName string            `json:"generateName"`
		Namespace    string            `json:"namespace"`
		Annotations  map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		ResourceClaims []corev1.PodResourceClaim `json:"resourceClaims"`
		InitContainers []containerView           `json:"initContainers"`
		Containers     []containerView           `json:"containers"`
		// SchedulingGroup names the PodGroup the pod belongs to (a field from 1.36, kept by
		// the API server with the GenericWorkload gate).
		SchedulingGroup *struct {
			PodGroupName *string `json:"podGroupName"`
		} `json:"schedulingGroup"`
	} `json:"spec"`
}

type containerView struct {
	Name string `json:"name"`
	// RestartPolicy Always makes an init container a sidecar, which keeps its GPUs while the app
	// runs.
	RestartPolicy string `json:"restartPolicy"`
	Resources     *struct {
		Claims   []corev1.ResourceClaim `json:"claims"`
		Limits   extendedQuantities     `json:"limits"`
		Requests extendedQuantities     `json:"requests"`
	} `json:"resources"`
}

func (c containerView) claims() []corev1.ResourceClaim {
	if c.Resources == nil {
		return nil
	}
	return c.Resources.Claims
}

// decodePod decodes case-sensitively, as the API server does, so a key is found exactly where the
// patch will point.
func decodePod(raw []byte) (*podView, error) {
	pod := &podView{}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, pod); err != nil {
		return nil, fmt.Errorf("decode pod: %w", err)
	}
	return pod, nil
}

// podGroupName is the PodGroup the pod names in spec.schedulingGroup, or "".
func (p *podView) podGroupName() string {
	if g := p.Spec.SchedulingGroup; g != nil && g.PodGroupName != nil {
		return *g.PodGroupName
	}
	return ""
}

func (p *podView) name() string {
	if p.Metadata.Name != "" {
		return p.Metadata.Name
	}
	return p.Metadata.GenerateName
}

// injection is what a pod still lacks.
type injection struct {
	addClaim   bool
	containers []int
}

// planInjection compares the pod with what the annotations ask for. Parts already there are kept
// (a pod copied from an injected one, or a reinvocation, stays as it is); anything under the
// webhook's claim name that is not what it would inject is denied rather than overwritten.
// entry is the spec.resourceClaims entry the pod must end up with.
func planInjection(pod *podView, entry corev1.PodResourceClaim, chosen []int) (injection, field.ErrorList) {
	var p injection
	var errs field.ErrorList
	claimsPath := field.NewPath("spec", "resourceClaims")
	found := false
	for i, rc := range pod.Spec.ResourceClaims {
		if rc.Name != ClaimName {
			continue
		}
		found = true
		if ptr.Equal(rc.ResourceClaimName, entry.ResourceClaimName) && ptr.Equal(rc.ResourceClaimTemplateName, entry.ResourceClaimTemplateName) {
			continue
		}
		errs = append(errs, field.Invalid(claimsPath.Index(i), rc, fmt.Sprintf(
			"the claim name %q is reserved for the GPUs the annotations ask for (%s); rename this entry and its container references, or remove them and let the webhook inject them",
			ClaimName, describeEntry(entry))))
	}
	p.addClaim = !found

	check := func(path *field.Path, c containerView) (wired bool) {
		for j, ref := range c.claims() {
			if ref.Name != ClaimName {
				continue
			}
			if ref.Request != "" && ref.Request != RequestName {
				errs = append(errs, field.Invalid(path.Child("resources", "claims").Index(j).Child("request"), ref.Request, fmt.Sprintf(
					"claim %q has only the request %q; remove the request field to use all its GPUs", ClaimName, RequestName)))
			}
			wired = true
		}
		return wired
	}
	for i, c := range pod.Spec.InitContainers {
		check(field.NewPath("spec", "initContainers").Index(i), c)
	}
	isChosen := make(map[int]bool, len(chosen))
	for _, i := range chosen {
		isChosen[i] = true
	}
	for i, c := range pod.Spec.Containers {
		if wired := check(field.NewPath("spec", "containers").Index(i), c); isChosen[i] && !wired {
			p.containers = append(p.containers, i)
		}
	}
	return p, errs
}

// patch writes the JSON patch directly from the plan: one operation per injected field and
// nothing else. (Diffing re-encoded JSON, as admission.PatchResponseFromRaw does, costs three more
// passes over the pod and is most of the webhook's latency.) Appending with "-" keeps whatever the
// user already listed.
func (p injection) patch(pod *podView, entry corev1.PodResourceClaim) []jsonpatch.JsonPatchOperation {
	var ops []jsonpatch.JsonPatchOperation
	if p.addClaim {
		if len(pod.Spec.ResourceClaims) == 0 {
			ops = append(ops, jsonpatch.NewOperation("add", "/spec/resourceClaims", []corev1.PodResourceClaim{entry}))
		} else {
			ops = append(ops, jsonpatch.NewOperation("add", "/spec/resourceClaims/-", entry))
		}
	}
	ref := corev1.ResourceClaim{Name: ClaimName}
	for _, i := range p.containers {
		c := pod.Spec.Containers[i]
		path := fmt.Sprintf("/spec/containers/%d/resources", i)
		switch {
		case c.Resources == nil:
			ops = append(ops, jsonpatch.NewOperation("add", path, map[string][]corev1.ResourceClaim{"claims": {ref}}))
		case len(c.Resources.Claims) == 0:
			ops = append(ops, jsonpatch.NewOperation("add", path+"/claims", []corev1.ResourceClaim{ref}))
		default:
			ops = append(ops, jsonpatch.NewOperation("add", path+"/claims/-", ref))
		}
	}
	return ops
}

// describeEntry names what a spec.resourceClaims entry refers to, for messages.
func describeEntry(e corev1.PodResourceClaim) string {
	if e.ResourceClaimName != nil {
		return fmt.Sprintf("resourceClaimName %q", *e.ResourceClaimName)
	}
	return fmt.Sprintf("resourceClaimTemplateName %q", ptr.Deref(e.ResourceClaimTemplateName, ""))
}
