package resourceversion

import (
	"reflect"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"
)

// FuzzDecodeJSON: DecodeJSON gives Decode's answer for any body an AdmissionReview may carry as a
// v1 claim or template, object and error alike. Seeds: every input and v1 form of the upgrade
// cases, as JSON, sent as both kinds.
func FuzzDecodeJSON(f *testing.F) {
	for _, tc := range upgradeCases(f) {
		for _, doc := range []string{tc.Input, tc.Want} {
			if j, err := yaml.YAMLToJSON([]byte(doc)); err == nil && doc != "" {
				f.Add(j, true)
				f.Add(j, false)
			}
		}
	}
	f.Fuzz(func(t *testing.T, raw []byte, template bool) {
		gvk := resourceapi.SchemeGroupVersion.WithKind(KindClaim)
		if template {
			gvk.Kind = KindTemplate
		}
		want, wantErr := Decode(raw, gvk)
		got, err := DecodeJSON(raw, gvk)
		if (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
			t.Fatalf("error %v, Decode's %v", err, wantErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decoded\n%+v\nDecode's\n%+v", got, want)
		}
	})
}
