// Package claimvalidation judges ResourceClaims and ResourceClaimTemplates (converted to v1) for
// one DRA driver: it denies what can never work and warns about what does not work right now.
// The Validator has no API server dependency, so the offline CLI runs the same checks.
package claimvalidation

import (
	"context"
	"errors"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

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
			v.held = diagnosis.NewHeld(v.view, o.claims, o.held...)
		}
	}
	return v
}

// Option configures a Validator.
type Option func(*options)

type options struct {
	view   []feasibility.Option
	claims diagnosis.ClaimLister
	held   []diagnosis.HeldOption
}

// WithServed makes the feasibility check run the allocator with the features served says the
// cluster serves.
func WithServed(served feasibility.Served) Option {
	return func(o *options) { o.view = append(o.view, feasibility.WithServed(served)) }
}

// WithClaims judges a claim (not a template) also against what the current allocations of the
// claims listed leave free: when every matching device is held, a warning names the holders. Call
// InvalidateClaims when what claims lists changes. opts configure the index of current
// allocations (diagnosis.Held).
func WithClaims(claims diagnosis.ClaimLister, opts ...diagnosis.HeldOption) Option {
	return func(o *options) { o.claims, o.held = claims, opts }
}

// Invalidate says that what the published source lists has changed; the next check reads it again.
func (v *Validator) Invalidate() {
	if v.view != nil {
		v.view.Invalidate()
	}
	if v.held != nil {
		// The fleet of current allocations is of the published devices too: have it rebuilt
		// now rather than by the next review.
		v.held.Invalidate()
	}
}

// Settle builds the index of the published devices, if it is not built, and waits until the
// fleet of current allocations is built for what the caches hold, or until ctx ends: a review
// after it finds both in place.
func (v *Validator) Settle(ctx context.Context) {
	if v.view == nil {
		return
	}
	if _, err := v.view.Snapshot(); err != nil {
		return
	}
	if v.held != nil {
		v.held.Settle(ctx)
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
	j := &judgement{obj: obj, ours: map[string]bool{}}
	for _, r := range feasibility.Requests(obj.Spec()) {
		v.checkRequest(ctx, j, r)
	}
	v.checkConfigs(j)
	if !j.judged {
		return j.res
	}
	// Feasibility is only worth asking about a claim whose requests are sound and whose classes
	// are known.
	if len(j.res.Errors) == 0 && !j.classMissing && !j.inventoryDown && v.view != nil {
		v.checkFeasible(ctx, j)
	}
	v.checkDeprecation(j)
	return j.res
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
