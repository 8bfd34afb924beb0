package feasibility

import (
	"context"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/lru"

	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
)

// heldCacheSize bounds the HeldNow answers remembered per state of the claims.
const heldCacheSize = 256

// heldState is the fleet of one snapshot and one generation of claims, with the answers found
// against it.
type heldState struct {
	snapshot *snapshot
	claims   uint64
	fleet    *deviceusage.Fleet
	answers  *lru.Cache
}

// HeldNow tells, for a claim spec that Unsatisfiable found the published devices can satisfy,
// whether the current allocations leave it devices: "" when they do (or when that is unknown),
// else which devices stand in its way and who holds them. It is a reason to warn, never to deny:
// a claim may wait for devices. Without WithClaims it always answers "".
func (v *View) HeldNow(ctx context.Context, namespace string, spec *resourceapi.ResourceClaimSpec) (string, error) {
	if v.claims == nil || len(spec.Devices.Requests) == 0 || wellFormed(spec) != nil {
		return "", nil
	}
	s, err := v.current()
	if err != nil {
		return "", err
	}
	st, err := v.heldState(s)
	if err != nil {
		return "", err
	}
	key := questionKey(namespace, v.featuresFor(ctx, s), spec)
	if key != nil {
		if msg, ok := st.answers.Get(*key); ok {
			return msg.(string), nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, v.timeout)
	defer cancel()
	diag, err := newDiagnoser(ctx, v, s, namespace, spec, st.fleet).run(ctx)
	if err != nil || ctx.Err() != nil {
		// Interrupted: no answer, and nothing remembered.
		klog.FromContext(ctx).V(2).Info("Current-allocation check ran out of time; no warning", "err", err)
		return "", nil
	}
	msg := ""
	if !diag.Allocatable && waitsForOthers(diag) && !undecided(diag) {
		msg = heldMessage(diag)
	}
	if key != nil {
		st.answers.Add(*key, msg)
	}
	return msg, nil
}

// heldState returns the fleet of s and the current claims, built once per change of either.
func (v *View) heldState(s *snapshot) (*heldState, error) {
	gen := v.claimsGeneration.Load()
	v.heldMu.Lock()
	defer v.heldMu.Unlock()
	if st := v.held; st != nil && st.snapshot == s && st.claims == gen {
		return st, nil
	}
	claims, err := v.claims.Claims()
	if err != nil {
		return nil, fmt.Errorf("list claims: %w", err)
	}
	// The held check reads of the fleet each device's use, capacity, counters and taints, never
	// its attributes (the allocator runs on fullSlices): the slices as kept serve, without
	// building an attribute map for every device of the cluster. Only the busy pools' devices
	// are kept: a free one is no obstacle.
	kept := make([]*resourceapi.ResourceSlice, len(s.slices))
	for i, sl := range s.slices {
		kept[i] = &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: sl.Name}, Spec: sl.Spec}
	}
	fl := deviceusage.Build(deviceusage.Input{Slices: kept, Claims: claims, BusyPoolsOnly: true})
	st := &heldState{snapshot: s, claims: gen, fleet: fl, answers: lru.New(heldCacheSize)}
	v.held = st
	return st, nil
}

// undecided: the allocator could not give an answer (it failed, or had no time for every node).
func undecided(diag *Diagnosis) bool {
	for _, f := range diag.Findings {
		if f.Cause == CauseUnknown {
			return true
		}
	}
	return false
}

// heldMessage is what keeps each request from its devices now, with who holds them.
func heldMessage(diag *Diagnosis) string {
	var parts []string
	for _, r := range diag.Requests {
		for _, f := range r.Findings {
			if f.Cause != CauseAllocated && f.Cause != CauseCounters && f.Cause != CauseCapacity {
				continue
			}
			p := fmt.Sprintf("request %s: %s", r.Name, f.Message)
			if len(f.Details) > 0 {
				p += " (" + strings.Join(f.Details, "; ") + ")"
			}
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "; ")
}
