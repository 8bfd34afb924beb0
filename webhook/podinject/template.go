package podinject

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"unicode"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

// hashLength is how many hex digits of the spec's SHA-256 go into a template name: enough that two
// different requests never meet in one namespace, short enough to read in `kubectl get`.
const hashLength = 10

// Subrequest names of a memory share: "share" tries a share of shared-memory GPUs, "whole" whole
// GPUs with at least the memory; a list of models tries model-<i>-share before model-<i>.
const (
	shareSubRequest = "share"
	wholeSubRequest = "whole"
	shareSuffix     = "-share"
)

// shareCompute is the compute a memory share asks for: the least there is, which each GPU's
// request policy rounds up to its minimum. Without it a share would take the policy's default, the
// whole GPU's compute, and no second share would fit beside it.
var shareCompute = resource.MustParse("1")

// template returns the managed ResourceClaimTemplate for a request, in v1 (the client writes it in
// whatever version the cluster serves): one request of Count GPUs of the annotations' class, or,
// for a list of models, one request whose subrequests try them in order (firstAvailable). A
// memory share (req.MemoryShare) tries, per model, a share of a shared-memory GPU (capacity
// requests: the memory, the least compute) before a whole GPU with at least the memory, so that
// in a mixed fleet the pod shares where it can and still runs on exclusive GPUs.
func (o options) template(namespace string, req Request) (*resourceapi.ResourceClaimTemplate, error) {
	request := resourceapi.DeviceRequest{Name: RequestName}
	switch {
	case req.MemoryShare && req.Memory != nil:
		models := req.Models
		if len(models) == 0 {
			models = []string{req.Model}
		}
		for i, model := range models {
			share, whole := shareSubRequest, wholeSubRequest
			if len(req.Models) > 0 {
				whole = fmt.Sprintf("%s%d", subRequestPrefix, i)
				share = whole + shareSuffix
			}
			request.FirstAvailable = append(request.FirstAvailable, resourceapi.DeviceSubRequest{
				Name:            share,
				DeviceClassName: o.classes[0].Name,
				Selectors:       append(o.selectors(model, nil), celSelector("device.allowMultipleAllocations")),
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           int64(req.Count),
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					deviceschema.CapMemory: req.Memory.DeepCopy(), deviceschema.CapCompute: shareCompute.DeepCopy(),
				}},
			}, resourceapi.DeviceSubRequest{
				Name:            whole,
				DeviceClassName: o.classes[0].Name,
				Selectors:       o.selectors(model, req.Memory),
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           int64(req.Count),
			})
		}
	case len(req.Models) > 0:
		for i, model := range req.Models {
			request.FirstAvailable = append(request.FirstAvailable, resourceapi.DeviceSubRequest{
				Name:            fmt.Sprintf("%s%d", subRequestPrefix, i),
				DeviceClassName: o.classes[0].Name,
				Selectors:       o.selectors(model, req.Memory),
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           int64(req.Count),
			})
		}
	default:
		request.Exactly = &resourceapi.ExactDeviceRequest{
			DeviceClassName: o.classes[0].Name,
			Selectors:       o.selectors(req.Model, req.Memory),
			AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
			Count:           int64(req.Count),
		}
	}
	return o.managedTemplate(namespace, req.Count, []resourceapi.DeviceRequest{request})
}

// selectors are the CEL selectors of a model ("" for any) and a least memory (nil for any).
func (o options) selectors(model string, memory *resource.Quantity) []resourceapi.DeviceSelector {
	var selectors []resourceapi.DeviceSelector
	if model != "" {
		selectors = append(selectors, celSelector(fmt.Sprintf("device.attributes[%s].%s == %s",
			celString(o.driverName), deviceschema.AttrModel, celString(model))))
	}
	if memory != nil {
		selectors = append(selectors, celSelector(fmt.Sprintf("device.capacity[%s].%s.compareTo(quantity(%s)) >= 0",
			celString(o.driverName), deviceschema.CapMemory, celString(memory.String()))))
	}
	return selectors
}

// managedTemplate is the template of these requests for count GPUs in all. Its name is derived
// from its spec alone, so every pod asking the same thing in a namespace shares one template and a
// changed request never reuses a template made for another.
func (o options) managedTemplate(namespace string, count int, requests []resourceapi.DeviceRequest) (*resourceapi.ResourceClaimTemplate, error) {
	spec := resourceapi.ResourceClaimTemplateSpec{
		Spec: resourceapi.ResourceClaimSpec{
			Devices: resourceapi.DeviceClaim{Requests: requests},
		},
	}
	sum, err := specDigest(&spec)
	if err != nil {
		return nil, err
	}
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s-%d-%s", ClaimName, count, hex.EncodeToString(sum[:])[:hashLength]),
			Namespace: namespace,
			Labels: map[string]string{
				ManagedByLabel:         ManagedBy,
				o.annotation(annCount): strconv.Itoa(count),
			},
		},
		Spec: spec,
	}, nil
}

func celSelector(expression string) resourceapi.DeviceSelector {
	return resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expression}}
}

// celString quotes s as a CEL string literal. CEL's escapes are not Go's (\x there is a code
// point, not a byte), so strconv.Quote is not safe; s must be valid UTF-8 (parseRequest checks).
func celString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			switch {
			case unicode.IsPrint(r):
				b.WriteRune(r)
			case r <= 0xffff:
				fmt.Fprintf(&b, `\u%04x`, r)
			default:
				fmt.Fprintf(&b, `\U%08x`, r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
