package diagnosis

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility/feasibilitytest"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// FuzzDiagnose gives Diagnose any claim spec against the busy cluster of diagnose_test.go, as a
// --cluster-state file can: a spec the API server refuses gets an error and nothing else does, a
// spec Diagnose calls allocatable is one the allocator allocates, and one the allocator allocates
// is called allocatable unless Diagnose says it does not know. An input that takes over 10 s
// counts as a crash too. Seeds: testdata/diagnose.yaml and testdata/fuzz/FuzzDiagnose.
func FuzzDiagnose(f *testing.F) {
	for _, tc := range feasibilitytest.LoadCases[diagnoseCase](f, "diagnose.yaml") {
		seed, err := json.Marshal(tc.Spec)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(seed)
	}
	ctx := context.Background()
	st, fl := busyCluster()
	view := feasibility.New(st, celcheck.New(feasibilitytest.Driver, deviceschema.DeviceSchema()))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var spec resourceapi.ResourceClaimSpec
		if json.Unmarshal(raw, &spec) != nil {
			return
		}
		resourceversion.Default(&spec)
		timer := time.AfterFunc(10*time.Second, func() { panic(fmt.Sprintf("SLOW INPUT %q", raw)) })
		d, err := Diagnose(ctx, view, "default", &spec, fl)
		timer.Stop()
		malformed := feasibility.WellFormed(&spec)
		switch {
		case (err != nil) != (malformed != nil):
			t.Fatalf("Diagnose: %v; wellFormed: %v", err, malformed)
		case err != nil:
			return
		}
		unknown := false
		for _, fd := range d.Findings {
			unknown = unknown || fd.Cause == CauseUnknown
		}
		if allocated := feasibilitytest.AllocatableWith(ctx, t, st, fl.AllocatedState(), &spec); d.Allocatable != allocated && (d.Allocatable || !unknown) {
			t.Fatalf("Diagnose says allocatable=%t, the allocator %t: %+v", d.Allocatable, allocated, d)
		}
	})
}
