// Package claimvalidation judges ResourceClaims and ResourceClaimTemplates (converted to v1) for
// one DRA driver: it denies what can never work and warns about what does not work right now.
// The Validator has no API server dependency, so the offline CLI runs the same checks.
package claimvalidation

import (
	"context"
	"errors"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/api/v1alpha1"
	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
	"github.com/gpu-dra/gpu-dra/internal/analysis/diagnosis"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// Validator runs the checks. It is safe for concurrent use.
type Validator struct {
	driver     string
	checker    *celcheck.Checker
	view       *feasibility.View
	held       *diagnosis.Held
	maxDevices int
	deny       map[Rule]bool
}

// New returns the validator gpu-webhook and kubectl dra validate both run, so the two cannot
// drift: selectors are judged against the device schema of driver, counts against the largest
// node of groups (nil: the defaults), and the findings of the deny rules reject instead of warn.
// With a published source the DeviceClass and feasibility checks run over what it lists (call
// Invalidate when that changes); without one they are off. opts tell the features the cluster
// serves, and the claims whose allocations a claim is also judged against.
func New(driver string, groups *nodegroups.Config, deny []Rule, published feasibility.Lister, opts ...Option) *Validator {
	if groups == nil {
		groups = &nodegroups.Config{}
	}
	v := &Validator{
		driver: driver,
		// One analyzer for the validator and the view, so each selector is analyzed once.
		checker:    celcheck.New(driver, deviceschema.DeviceSchema()),
		maxDevices: groups.MaxDevicesPerNode(),
		deny:       map[Rule]bool{},
	}
	for _, r := range deny {
		v.deny[r] = true
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if published != nil {
		v.view = feasibility.New(published, v.checker, o.view...)
		if o.claims != nil {
			v.held = diagnosis.NewHeld(v.view, o.claims)
		}
	}
	return v
}

// Option configures a Validator.
type Option func(*options)

type options struct {
	view   []feasibility.Option
	claims diagnosis.ClaimLister
}

// WithServed makes the feasibility check run the allocator with the features served says the
// cluster serves.
func WithServed(served feasibility.Served) Option {
	return func(o *options) { o.view = append(o.view, feasibility.WithServed(served)) }
}

// WithClaims judges a claim (not a template) also against what the current allocations of the
// claims listed leave free: when every matching device is held, a warning names the holders. Call
// InvalidateClaims when what claims lists changes.
func WithClaims(claims diagnosis.ClaimLister) Option {
	return func(o *options) { o.claims = claims }
}

// Invalidate says that what the published source lists has changed; the next check reads it again.
func (v *Validator) Invalidate() {
	if v.view != nil {
		v.view.Invalidate()
	}
}

// InvalidateClaims says that what the claims of WithClaims list has changed.
func (v *Validator) InvalidateClaims() {
	if v.held != nil {
		v.held.Invalidate()
	}
}

// PublishesShared reports whether this driver publishes devices several claims may share
// (consumable capacity); false without a published source.
func (v *Validator) PublishesShared() (bool, error) {
	if v.view == nil {
		return false, nil
	}
	return v.view.PublishesShared(v.driver)
}

// requestPath is where r sits in obj, as the user wrote it.
func requestPath(obj *resourceversion.Object, r *feasibility.Request) *field.Path {
	p := obj.SpecPath().Child("devices", "requests").Index(r.Index)
	switch {
	case r.Subrequest >= 0:
		return p.Child("firstAvailable").Index(r.Subrequest)
	case obj.IsV1Beta1():
		// v1beta1 has no `exactly`: point at the fields where the user wrote them.
		return p
	}
	return p.Child("exactly")
}

// Validate judges obj. Requests and opaque config of other drivers pass untouched.
func (v *Validator) Validate(ctx context.Context, obj *resourceversion.Object) Result {
	logger := klog.FromContext(ctx)
	var res Result
	judged := false
	classMissing := false
	inventoryDown := false
	ourRequests := map[string]bool{}
	for _, r := range feasibility.Requests(obj.Spec()) {
		path := requestPath(obj, r)
		var class *resourceapi.DeviceClass
		classKnown := v.view != nil
		if classKnown {
			c, err := v.view.DeviceClass(r.Class)
			if err != nil {
				// Without the class only the selectors can say whether the request is ours.
				logger.Info("DeviceClass lookup failed; judging by the selectors only", "deviceClass", r.Class, "err", err)
				classKnown = false
				inventoryDown = true
			}
			class = c
		}
		ours := v.classIsOurs(class)
		for _, s := range r.Selectors {
			if s.CEL != nil && v.checker.Analyze(s.CEL.Expression).NamesDomain {
				ours = true
			}
		}
		missing := classKnown && class == nil
		if !ours && !missing {
			continue
		}
		judged = true
		ourRequests[resourceclaim.BaseRequestRef(r.Name)] = true
		for i, s := range r.Selectors {
			if s.CEL == nil {
				continue
			}
			p := path.Child("selectors").Index(i).Child("cel", "expression")
			a := v.checker.Analyze(s.CEL.Expression)
			if a.CompileError != "" {
				res.add(true, field.Invalid(p, s.CEL.Expression, a.CompileError))
				continue
			}
			for _, issue := range a.Issues {
				res.add(true, field.Invalid(p, s.CEL.Expression, issue))
			}
		}
		if ours && v.maxDevices > 0 && r.Mode == resourceapi.DeviceAllocationModeExactCount && r.Count > int64(v.maxDevices) {
			res.add(true, field.Invalid(path.Child("count"), r.Count, fmt.Sprintf("request %s wants %d devices, but no node of driver %s holds more than %d; request at most %d or split the work across several claims",
				r.Name, r.Count, v.driver, v.maxDevices, v.maxDevices)))
		}
		if missing {
			classMissing = true
			notFound := field.NotFound(path.Child("deviceClassName"), r.Class)
			notFound.Detail = fmt.Sprintf("DeviceClass %q does not exist; create it or use this driver's class %q", r.Class, v.driver)
			res.add(v.deny[RuleMissingClass], notFound)
		}
	}
	configs := obj.SpecPath().Child("devices", "config")
	for i, c := range obj.Spec().Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != v.driver {
			continue
		}
		judged = true
		if _, errs := v1alpha1.Decode(c.Opaque.Parameters.Raw, configs.Index(i).Child("opaque", "parameters")); len(errs) > 0 {
			res.addConfig(errs)
		}
	}
	if !judged {
		return res
	}
	if len(res.Errors) == 0 && !classMissing && !inventoryDown && v.view != nil {
		msg, err := v.view.Unsatisfiable(ctx, obj.Namespace(), ownPart(obj.Spec(), ourRequests))
		switch {
		case err != nil:
			logger.Error(err, "Feasibility check failed; admitting without it")
		case msg != "":
			res.add(v.deny[RuleUnsatisfiable], field.Invalid(obj.SpecPath().Child("devices"), field.OmitValueType{}, "nothing currently published can satisfy the claim: "+msg))
		case obj.Arrived.Kind == resourceversion.KindClaim && v.held != nil:
			// A claim is allocated as soon as it is scheduled; a template's claims come later,
			// when what is free will have changed. Never a denial: a claim may wait for devices.
			held, err := v.held.HeldNow(ctx, obj.Namespace(), ownPart(obj.Spec(), ourRequests))
			switch {
			case err != nil:
				logger.Error(err, "Current-allocation check failed; admitting without it")
			case held != "":
				res.add(false, field.Invalid(obj.SpecPath().Child("devices"), field.OmitValueType{}, "fits, but every matching GPU is held now: "+held))
			}
		}
	}
	if obj.Deprecated() {
		// About the object as a whole, so no field.
		res.add(v.deny[RuleDeprecatedVersion], &field.Error{Type: field.ErrorTypeInvalid, BadValue: obj.Arrived.GroupVersion().String(),
			Detail: fmt.Sprintf("%s %s is deprecated and removed in Kubernetes 1.38; write it as resource.k8s.io/v1: %s", obj.Arrived.GroupVersion(), obj.Arrived.Kind, obj.V1Form())})
	}
	return res
}

// classIsOurs: the class selects this driver's devices.
func (v *Validator) classIsOurs(class *resourceapi.DeviceClass) bool {
	if class == nil {
		return false
	}
	for _, s := range class.Spec.Selectors {
		if s.CEL == nil {
			continue
		}
		a := v.checker.Analyze(s.CEL.Expression)
		if a.MentionsDriver || a.NamesDomain {
			return true
		}
	}
	return false
}

// ownPart is the claim restricted to this driver's requests, so that a feasibility warning can
// never be about another driver's devices. Constraints naming other requests go with them.
func ownPart(spec *resourceapi.ResourceClaimSpec, ours map[string]bool) *resourceapi.ResourceClaimSpec {
	if len(ours) == len(spec.Devices.Requests) {
		return spec
	}
	out := &resourceapi.ResourceClaimSpec{}
	for _, r := range spec.Devices.Requests {
		if ours[r.Name] {
			out.Devices.Requests = append(out.Devices.Requests, r)
		}
	}
	for _, c := range spec.Devices.Constraints {
		keep := true
		for _, name := range c.Requests {
			if !ours[resourceclaim.BaseRequestRef(name)] {
				keep = false
			}
		}
		if keep {
			out.Devices.Constraints = append(out.Devices.Constraints, c)
		}
	}
	return out
}

// ValidateTemplate judges a v1 template the system itself is about to create (the pod injector's
// managed templates), so those pass the same rules as the user's: denials become the error,
// warnings are returned for the user.
func (v *Validator) ValidateTemplate(ctx context.Context, t *resourceapi.ResourceClaimTemplate) ([]string, error) {
	res := v.Validate(ctx, &resourceversion.Object{Arrived: resourceapi.SchemeGroupVersion.WithKind(resourceversion.KindTemplate), Template: t})
	if len(res.Errors) > 0 {
		return res.WarningMessages(), errors.New(strings.Join(res.ErrorMessages(), "; "))
	}
	return res.WarningMessages(), nil
}
