package claimvalidation

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/api/v1alpha1"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// judgement is one Validate: the findings so far and what the checks learnt on the way.
type judgement struct {
	obj *resourceversion.Object
	res Result
	// judged: some request or opaque config is this driver's.
	judged bool
	// classMissing: a request of ours names a DeviceClass that does not exist.
	classMissing bool
	// inventoryDown: the published DeviceClasses could not be read.
	inventoryDown bool
	// ours are this driver's requests, by name.
	ours map[string]bool
}

// checkRequest judges one request or subrequest if it is this driver's (by its class or its
// selectors) or names a class that does not exist: its selectors, its count, its class.
func (v *Validator) checkRequest(ctx context.Context, j *judgement, r *feasibility.Request) {
	class, classKnown := v.lookupClass(ctx, j, r)
	ours := v.classIsOurs(class)
	for _, s := range r.Selectors {
		if s.CEL != nil && v.checker.Analyze(s.CEL.Expression).NamesDomain {
			ours = true
		}
	}
	missing := classKnown && class == nil
	if !ours && !missing {
		return
	}
	j.judged = true
	j.ours[resourceclaim.BaseRequestRef(r.Name)] = true
	path := requestPath(j.obj, r)
	v.checkSelectors(j, r, path)
	if ours {
		v.checkCount(j, r, path)
	}
	if missing {
		j.classMissing = true
		notFound := field.NotFound(path.Child("deviceClassName"), r.Class)
		notFound.Detail = fmt.Sprintf("DeviceClass %q does not exist; create it or use this driver's class %q", r.Class, v.driver)
		j.res.add(v.deny[RuleMissingClass], notFound)
	}
}

// lookupClass finds the request's DeviceClass; known is false without a published source or
// when it cannot be read.
func (v *Validator) lookupClass(ctx context.Context, j *judgement, r *feasibility.Request) (class *resourceapi.DeviceClass, known bool) {
	if v.view == nil {
		return nil, false
	}
	class, err := v.view.DeviceClass(r.Class)
	if err != nil {
		// Without the class only the selectors can say whether the request is ours.
		klog.FromContext(ctx).Info("DeviceClass lookup failed; judging by the selectors only", "deviceClass", r.Class, "err", err)
		j.inventoryDown = true
		return class, false
	}
	return class, true
}

// checkSelectors denies selectors that do not compile or read what this driver never publishes.
func (v *Validator) checkSelectors(j *judgement, r *feasibility.Request, path *field.Path) {
	for i, s := range r.Selectors {
		if s.CEL == nil {
			continue
		}
		p := path.Child("selectors").Index(i).Child("cel", "expression")
		a := v.checker.Analyze(s.CEL.Expression)
		if a.CompileError != "" {
			j.res.add(true, field.Invalid(p, s.CEL.Expression, a.CompileError))
			continue
		}
		for _, issue := range a.Issues {
			j.res.add(true, field.Invalid(p, s.CEL.Expression, issue))
		}
	}
}

// checkCount denies a count no node of the driver holds.
func (v *Validator) checkCount(j *judgement, r *feasibility.Request, path *field.Path) {
	if v.maxDevices > 0 && r.Mode == resourceapi.DeviceAllocationModeExactCount && r.Count > int64(v.maxDevices) {
		j.res.add(true, field.Invalid(path.Child("count"), r.Count, fmt.Sprintf("request %s wants %d devices, but no node of driver %s holds more than %d; request at most %d or split the work across several claims",
			r.Name, r.Count, v.driver, v.maxDevices, v.maxDevices)))
	}
}

// checkConfigs denies this driver's opaque GpuConfigs that do not decode or validate.
func (v *Validator) checkConfigs(j *judgement) {
	configs := j.obj.SpecPath().Child("devices", "config")
	for i, c := range j.obj.Spec().Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != v.driver {
			continue
		}
		j.judged = true
		if _, errs := v1alpha1.Decode(c.Opaque.Parameters.Raw, configs.Index(i).Child("opaque", "parameters")); len(errs) > 0 {
			j.res.addConfig(errs)
		}
	}
}

// checkFeasible asks whether what is published can satisfy this driver's part of the claim and,
// for a claim, whether the current allocations leave it devices.
func (v *Validator) checkFeasible(ctx context.Context, j *judgement) {
	logger := klog.FromContext(ctx)
	obj := j.obj
	own := ownPart(obj.Spec(), j.ours)
	msg, err := v.view.Unsatisfiable(ctx, obj.Namespace(), own)
	switch {
	case err != nil:
		logger.Error(err, "Feasibility check failed; admitting without it")
	case msg != "":
		j.res.add(v.deny[RuleUnsatisfiable], field.Invalid(obj.SpecPath().Child("devices"), field.OmitValueType{}, "nothing currently published can satisfy the claim: "+msg))
	case obj.Arrived.Kind == resourceversion.KindClaim && v.held != nil:
		// A claim is allocated as soon as it is scheduled; a template's claims come later,
		// when what is free will have changed. Never a denial: a claim may wait for devices.
		held, err := v.held.HeldNow(ctx, obj.Namespace(), own)
		switch {
		case err != nil:
			logger.Error(err, "Current-allocation check failed; admitting without it")
		case held != "":
			j.res.add(false, field.Invalid(obj.SpecPath().Child("devices"), field.OmitValueType{}, "fits, but every matching GPU is held now: "+held))
		}
	}
}

// checkDeprecation finds an object written in a deprecated version and offers its v1 form.
func (v *Validator) checkDeprecation(j *judgement) {
	obj := j.obj
	if !obj.Deprecated() {
		return
	}
	// About the object as a whole, so no field.
	j.res.add(v.deny[RuleDeprecatedVersion], &field.Error{Type: field.ErrorTypeInvalid, BadValue: obj.Arrived.GroupVersion().String(),
		Detail: fmt.Sprintf("%s %s is deprecated and removed in Kubernetes 1.38; write it as resource.k8s.io/v1: %s", obj.Arrived.GroupVersion(), obj.Arrived.Kind, obj.V1Form())})
}
