package app

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/gpu-dra/gpu-dra/internal/analysis/diagnosis"
)

// whyCases run `kubectl dra why` on hand-made cluster states. causes are the findings' causes in
// the order the report lists them (requests first, then the claim's); text output is golden, and
// so is the JSON of the cases marked json.
var whyCases = []struct {
	name        string
	state       string
	args        []string
	causes      []diagnosis.Cause
	allocatable bool
	json        bool
	code        int
}{
	{name: "seed-running", state: whyCluster, args: []string{"pod/seed"}},
	{name: "nine", state: whyCluster, args: []string{"pod/nine"}, causes: []diagnosis.Cause{diagnosis.CauseTooFew}, json: true},
	{name: "typo-value", state: whyCluster, args: []string{"pod", "typo"}, causes: []diagnosis.Cause{diagnosis.CauseNoMatch}, json: true},
	{name: "typo-attribute", state: whyCluster, args: []string{"resourceclaim/modle"}, causes: []diagnosis.Cause{diagnosis.CauseInvalidSelector}},
	{name: "no-class", state: whyCluster, args: []string{"resourceclaims/noclass"}, causes: []diagnosis.Cause{diagnosis.CauseNoSuchClass}},
	{name: "constraint", state: whyCluster, args: []string{"po/pair"}, causes: []diagnosis.Cause{diagnosis.CauseConstraint}, json: true},
	{name: "conflict", state: whyCluster, args: []string{"resourceclaim/conflict"}, causes: []diagnosis.Cause{diagnosis.CauseConflict}},
	{name: "apart", state: whyCluster, args: []string{"resourceclaim/apart"}, causes: []diagnosis.Cause{diagnosis.CauseConflict}},
	{name: "fits", state: whyCluster, args: []string{"pod/fits"}, causes: []diagnosis.Cause{diagnosis.CauseAllocatable}, allocatable: true},
	{name: "first-available", state: whyCluster, args: []string{"resourceclaim/fallback"},
		causes: []diagnosis.Cause{diagnosis.CauseTooFew, diagnosis.CauseAllocatable}, allocatable: true},
	{name: "claim-not-created", state: whyCluster, args: []string{"pod/waiting"}, causes: []diagnosis.Cause{diagnosis.CauseAllocatable}, allocatable: true},
	{name: "template-missing", state: whyCluster, args: []string{"pod/orphan"}},
	{name: "held", state: whyBusy, args: []string{"pod/latest"}, causes: []diagnosis.Cause{diagnosis.CauseAllocated}, json: true},
	{name: "tainted", state: whyBusy, args: []string{"pod/old"}, causes: []diagnosis.Cause{diagnosis.CauseTainted}, json: true},
	{name: "held-and-constraint", state: whyBusy, args: []string{"resourceclaim/pair"},
		causes: []diagnosis.Cause{diagnosis.CauseAllocated, diagnosis.CauseAllocated, diagnosis.CauseConstraint}},
	{name: "tolerated", state: whyBusy, args: []string{"resourceclaim/old-tolerant"}, causes: []diagnosis.Cause{diagnosis.CauseAllocatable}, allocatable: true},
	{name: "counters", state: statusShared, args: []string{"resourceclaim/whole", "-n", "team-b"}, causes: []diagnosis.Cause{diagnosis.CauseCounters}, json: true},
	{name: "capacity", state: statusShared, args: []string{"resourceclaim/big-share", "-n", "team-b"}, causes: []diagnosis.Cause{diagnosis.CauseCapacity}},
	{name: "share-fits", state: statusShared, args: []string{"resourceclaim/small-share", "-n", "team-b"},
		causes: []diagnosis.Cause{diagnosis.CauseAllocatable}, allocatable: true},
	{name: "no-such-pod", state: whyCluster, args: []string{"pod/nope"}, code: ExitFailed},
	{name: "bad-target", state: whyCluster, args: []string{"node/las1"}, code: ExitFailed},
	{name: "malformed", state: "testdata/why/malformed.yaml", args: []string{"resourceclaim/twice"}, code: ExitFailed},
}

func TestWhy(t *testing.T) {
	noCluster(t)
	for _, tc := range whyCases {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"why", "--cluster-state", tc.state}, tc.args...)
			r := run(t, "", args...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", r.code, tc.code, r.stderr)
			}
			golden(t, "testdata/why/golden/"+tc.name+".txt", r.stdout+r.stderr)
			if tc.code != 0 {
				return
			}
			j := run(t, "", append(args, "-o", "json")...)
			if tc.json {
				golden(t, "testdata/why/golden/"+tc.name+".json", j.stdout)
			}
			var rep whyReport
			if err := json.Unmarshal([]byte(j.stdout), &rep); err != nil {
				t.Fatalf("-o json: %v\n%s", err, j.stdout)
			}
			var causes []diagnosis.Cause
			allocatable := false
			for _, c := range rep.Claims {
				if c.Diagnosis == nil {
					continue
				}
				allocatable = allocatable || c.Diagnosis.Allocatable
				for _, r := range c.Diagnosis.Requests {
					for _, f := range r.Findings {
						causes = append(causes, f.Cause)
					}
				}
				for _, f := range c.Diagnosis.Findings {
					causes = append(causes, f.Cause)
				}
			}
			if !slices.Equal(causes, tc.causes) || allocatable != tc.allocatable {
				t.Errorf("causes %v, allocatable %t; want %v, %t", causes, allocatable, tc.causes, tc.allocatable)
			}
		})
	}
}
