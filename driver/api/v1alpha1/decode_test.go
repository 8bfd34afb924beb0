package v1alpha1

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

const head = `"apiVersion":"gpu.resource.example.com/v1alpha1","kind":"GpuConfig"`

func TestDecode(t *testing.T) {
	path := field.NewPath("spec", "devices", "config").Index(0).Child("opaque", "parameters")
	tests := []struct {
		name string
		raw  string
		// want is the defaulted sharing on success.
		want *GpuSharing
		// wantErr are substrings the error must contain, including the field path.
		wantErr []string
	}{
		{
			name: "empty config gets the default",
			raw:  `{` + head + `}`,
			want: &GpuSharing{Strategy: TimeSlicingStrategy, TimeSlicingConfig: &TimeSlicingConfig{Interval: DefaultTimeSlice}},
		},
		{
			name: "time slicing without interval is defaulted",
			raw:  `{` + head + `,"sharing":{"strategy":"TimeSlicing"}}`,
			want: &GpuSharing{Strategy: TimeSlicingStrategy, TimeSlicingConfig: &TimeSlicingConfig{Interval: DefaultTimeSlice}},
		},
		{
			name: "time slicing long",
			raw:  `{` + head + `,"sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`,
			want: &GpuSharing{Strategy: TimeSlicingStrategy, TimeSlicingConfig: &TimeSlicingConfig{Interval: LongTimeSlice}},
		},
		{
			name: "space partitioning",
			raw:  `{` + head + `,"sharing":{"strategy":"SpacePartitioning","spacePartitioningConfig":{"partitionCount":3}}}`,
			want: &GpuSharing{Strategy: SpacePartitioningStrategy, SpacePartitioningConfig: &SpacePartitioningConfig{PartitionCount: 3}},
		},
		{
			name:    "unknown strategy",
			raw:     `{` + head + `,"sharing":{"strategy":"Magic"}}`,
			wantErr: []string{"spec.devices.config[0].opaque.parameters.sharing.strategy", `"Magic"`, "TimeSlicing", "SpacePartitioning"},
		},
		{
			name:    "missing strategy",
			raw:     `{` + head + `,"sharing":{}}`,
			wantErr: []string{"parameters.sharing.strategy", "Required"},
		},
		{
			name:    "bad interval",
			raw:     `{` + head + `,"sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Forever"}}}`,
			wantErr: []string{"parameters.sharing.timeSlicingConfig.interval", `"Forever"`, "Default", "Short", "Medium", "Long"},
		},
		{
			name:    "negative partition count",
			raw:     `{` + head + `,"sharing":{"strategy":"SpacePartitioning","spacePartitioningConfig":{"partitionCount":-1}}}`,
			wantErr: []string{"parameters.sharing.spacePartitioningConfig.partitionCount", "-1", "at least 1"},
		},
		{
			name:    "space partitioning without count",
			raw:     `{` + head + `,"sharing":{"strategy":"SpacePartitioning"}}`,
			wantErr: []string{"parameters.sharing.spacePartitioningConfig.partitionCount", "Required"},
		},
		{
			name:    "settings of the other strategy",
			raw:     `{` + head + `,"sharing":{"strategy":"TimeSlicing","spacePartitioningConfig":{"partitionCount":2}}}`,
			wantErr: []string{"parameters.sharing.spacePartitioningConfig", "Forbidden", "only allowed with strategy SpacePartitioning"},
		},
		{
			name:    "misspelled field",
			raw:     `{` + head + `,"sharing":{"stratgy":"TimeSlicing"}}`,
			wantErr: []string{"spec.devices.config[0].opaque.parameters", `unknown field "sharing.stratgy"`, "remove it or fix its spelling"},
		},
		{
			name:    "wrong kind",
			raw:     `{"apiVersion":"gpu.resource.example.com/v1alpha1","kind":"CpuConfig"}`,
			wantErr: []string{"parameters.kind", `"CpuConfig"`, `must be "GpuConfig"`},
		},
		{
			name:    "wrong apiVersion",
			raw:     `{"apiVersion":"gpu.resource.example.com/v1","kind":"GpuConfig"}`,
			wantErr: []string{"parameters.apiVersion", `must be "gpu.resource.example.com/v1alpha1"`},
		},
		{
			name:    "not JSON",
			raw:     `sharing: TimeSlicing`,
			wantErr: []string{"spec.devices.config[0].opaque.parameters", "not a valid GpuConfig"},
		},
		{
			name:    "wrong type",
			raw:     `{` + head + `,"sharing":{"strategy":"SpacePartitioning","spacePartitioningConfig":{"partitionCount":"two"}}}`,
			wantErr: []string{"spec.devices.config[0].opaque.parameters", "not a valid GpuConfig"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, errs := Decode([]byte(tc.raw), path)
			err := errs.ToAggregate()
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("Decode succeeded with %+v, want an error containing %q", cfg, tc.wantErr)
				}
				for _, s := range tc.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if got, want := *cfg.Sharing, *tc.want; got.Strategy != want.Strategy ||
				(got.TimeSlicingConfig == nil) != (want.TimeSlicingConfig == nil) ||
				(got.SpacePartitioningConfig == nil) != (want.SpacePartitioningConfig == nil) ||
				(want.TimeSlicingConfig != nil && *got.TimeSlicingConfig != *want.TimeSlicingConfig) ||
				(want.SpacePartitioningConfig != nil && *got.SpacePartitioningConfig != *want.SpacePartitioningConfig) {
				t.Errorf("sharing = %+v, want %+v", got, want)
			}
			if errs := cfg.Validate(path); len(errs) > 0 {
				t.Errorf("decoded config does not validate: %v", errs)
			}
		})
	}
}

func TestDecodeTestdata(t *testing.T) {
	files, err := filepath.Glob("testdata/configs/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test configs: %v", err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, errs := Decode(raw, field.NewPath("parameters")); len(errs) > 0 {
			t.Errorf("%s: %v", f, errs)
		}
	}
}

func TestDefaultGpuConfigValidates(t *testing.T) {
	if errs := DefaultGpuConfig().Validate(field.NewPath("x")); len(errs) > 0 {
		t.Fatalf("default config is invalid: %v", errs)
	}
}

// FuzzDecode: no input may panic, and whatever decodes must validate.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{` + head + `}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		cfg, errs := Decode(raw, field.NewPath("p"))
		if len(errs) > 0 {
			return
		}
		if errs := cfg.Validate(field.NewPath("p")); len(errs) > 0 {
			t.Fatalf("Decode accepted %q but Validate rejects it: %v", raw, errs)
		}
	})
}
