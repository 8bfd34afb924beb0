package charttest

import (
	"flag"
	"io"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/certs"
	"github.com/gpu-dra/gpu-dra/driver/api/v1alpha1"
	"github.com/gpu-dra/gpu-dra/webhook/podinject"
	"github.com/gpu-dra/gpu-dra/webhook/server"
)

// deviceClassValues configure three classes: the default one, a time-sliced one with its own
// extended resource, and one for the upstream demo's example.com/gpu with an extra selector.
const deviceClassValues = `
deviceClasses:
  - name: ""
  - name: gpu-timesliced.example.com
    extendedResourceName: gpu.example.com/timesliced-gpu
    config:
      - apiVersion: gpu.resource.example.com/v1alpha1
        kind: GpuConfig
        sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Long}}
  - name: example-gpu.example.com
    extendedResourceName: example.com/gpu
    selectors:
      - device.attributes["gpu.example.com"].model == "LATEST-GPU-MODEL"
`

// valuesYAML is a values file, then --set assignments over it.
func valuesYAML(t testing.TB, doc string, sets ...string) map[string]any {
	t.Helper()
	vals := map[string]any{}
	if err := yaml.Unmarshal([]byte(doc), &vals); err != nil {
		t.Fatalf("values %s: %v", doc, err)
	}
	for k, v := range values(t, sets...) {
		vals[k] = v
	}
	return vals
}

// TestDeviceClasses renders several classes for each supported release and follows them into
// everything that names a class: the objects, the webhook's flags, its matchConditions, NOTES.
func TestDeviceClasses(t *testing.T) {
	// What the downward API gives the webhook.
	t.Setenv("POD_NAMESPACE", "gpu-dra")
	wantFlags := []podinject.DeviceClass{
		{Name: "gpu.example.com", ExtendedResourceName: "gpu.example.com/gpu"},
		{Name: "gpu-timesliced.example.com", ExtendedResourceName: "gpu.example.com/timesliced-gpu"},
		{Name: "example-gpu.example.com", ExtendedResourceName: "example.com/gpu"},
	}
	for _, c := range clusters {
		t.Run(c.name, func(t *testing.T) {
			r := mustRender(t, capabilities(t, c), valuesYAML(t, deviceClassValues, installSets...))
			// 1.32 and 1.33 have no extendedResourceName in their schema, and helm applies
			// server-side: the field would fail the install.
			withField := c.wantResourceAPI == "resource.k8s.io/v1"
			for _, want := range wantFlags {
				m, ok := r.find("DeviceClass", want.Name)
				if !ok {
					t.Fatalf("no DeviceClass %s", want.Name)
				}
				var dc resourceapi.DeviceClass
				decode(t, m, &dc) // strict: the v1 type knows every field of the other versions' classes
				got := ""
				if dc.Spec.ExtendedResourceName != nil {
					got = *dc.Spec.ExtendedResourceName
				}
				if withField && got != string(want.ExtendedResourceName) || !withField && got != "" {
					t.Errorf("%s: extendedResourceName %q on %s", want.Name, got, c.name)
				}
				if s := dc.Spec.Selectors; len(s) == 0 || s[0].CEL.Expression != `device.driver == "gpu.example.com"` {
					t.Errorf("%s: selectors %+v do not start with the driver's", want.Name, s)
				}
				for i, cfg := range dc.Spec.Config {
					if cfg.Opaque == nil || cfg.Opaque.Driver != "gpu.example.com" {
						t.Fatalf("%s: config %d is not the driver's opaque config: %+v", want.Name, i, cfg)
					}
					// What the kubelet plugin will decode at prepare.
					if _, errs := v1alpha1.Decode(cfg.Opaque.Parameters.Raw, field.NewPath("config")); len(errs) > 0 {
						t.Errorf("%s: config %d: %v", want.Name, i, errs)
					}
				}
			}
			if dc, _ := r.find("DeviceClass", "example-gpu.example.com"); !strings.Contains(dc.YAML, `model == \"LATEST-GPU-MODEL\"`) {
				t.Errorf("extra selector missing:\n%s", dc.YAML)
			}
			if dc, _ := r.find("DeviceClass", "gpu-timesliced.example.com"); !strings.Contains(dc.YAML, "strategy: TimeSlicing") {
				t.Errorf("class config missing:\n%s", dc.YAML)
			}

			// The webhook binary reads the classes from its flags, as the chart renders them.
			opts := server.NewOptions()
			fs := flag.NewFlagSet("gpu-webhook", flag.ContinueOnError)
			opts.AddFlags(fs)
			certs.NewOptions().AddFlags(fs)
			fs.SetOutput(io.Discard)
			if err := fs.Parse(r.webhookContainer(t).Command[1:]); err != nil {
				t.Fatalf("gpu-webhook flags: %v", err)
			}
			if !slices.Equal(opts.DeviceClasses, wantFlags) {
				t.Errorf("webhook classes = %+v, want %+v", opts.DeviceClasses, wantFlags)
			}
			if err := opts.Validate(); err != nil {
				t.Errorf("gpu-webhook would refuse its flags: %v", err)
			}

			vm, _ := r.find("ValidatingWebhookConfiguration", "")
			var vwc admissionregistrationv1.ValidatingWebhookConfiguration
			decode(t, vm, &vwc)
			forDriver := vwc.Webhooks[0].MatchConditions[2].Expression
			if !strings.Contains(forDriver, "in ['gpu.example.com', 'gpu-timesliced.example.com', 'example-gpu.example.com']") {
				t.Errorf("claim webhook does not route every class to the webhook:\n%s", forDriver)
			}
			mm, _ := r.find("MutatingWebhookConfiguration", "")
			var mwc admissionregistrationv1.MutatingWebhookConfiguration
			decode(t, mm, &mwc)
			pods := mwc.Webhooks[0].MatchConditions[0].Expression
			for _, name := range []string{"gpu.example.com/gpu", "gpu.example.com/timesliced-gpu", "example.com/gpu",
				"deviceclass.resource.kubernetes.io/gpu.example.com", "deviceclass.resource.kubernetes.io/gpu-timesliced.example.com", "deviceclass.resource.kubernetes.io/example-gpu.example.com"} {
				if !strings.Contains(pods, "'"+name+"'") {
					t.Errorf("pods asking for %s are not sent to the webhook:\n%s", name, pods)
				}
			}
			if !strings.Contains(r.Notes, "DeviceClasses: gpu.example.com, gpu-timesliced.example.com, example-gpu.example.com (") {
				t.Errorf("NOTES.txt does not list the classes:\n%s", r.Notes)
			}
		})
	}
}

// TestExtendedResourceNameDefault: the default class gets <driverName>/gpu where the schema has
// the field; "" turns it off, and the webhook then translates only the implicit name.
func TestExtendedResourceNameDefault(t *testing.T) {
	for _, tc := range []struct {
		name, values, want string
	}{
		{name: "default", want: "gpu.example.com/gpu"},
		{name: "other driver", values: "driverName: gpu.acme.org", want: "gpu.acme.org/gpu"},
		{name: "off", values: `deviceClasses: [{name: "", extendedResourceName: ""}]`},
		{name: "null", values: `deviceClasses: [{name: "", extendedResourceName: null}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRender(t, capabilities(t, clusters[2]), valuesYAML(t, tc.values))
			dc, _ := r.find("DeviceClass", "")
			var obj resourceapi.DeviceClass
			decode(t, dc, &obj)
			got := ""
			if obj.Spec.ExtendedResourceName != nil {
				got = *obj.Spec.ExtendedResourceName
			}
			if got != tc.want {
				t.Errorf("extendedResourceName = %q, want %q", got, tc.want)
			}
			want := obj.Name
			if tc.want != "" {
				want += "=" + tc.want
			}
			if got := flagValue(r.webhookContainer(t).Command, "--device-classes"); got != want {
				t.Errorf("webhook --device-classes=%s, want %s", got, want)
			}
		})
	}
}

// TestDeviceClassValues: what the schema and the render refuse, each naming the value and the fix.
func TestDeviceClassValues(t *testing.T) {
	for _, tc := range []struct {
		name, values, wantErr string
	}{
		{"same name twice, one by default", `deviceClasses: [{name: ""}, {name: gpu.example.com, extendedResourceName: ""}]`,
			`deviceClasses[1].name: DeviceClass "gpu.example.com" is also deviceClasses[0]; give each class its own name ("" stands for driverName)`},
		{"same extended resource twice", `deviceClasses: [{name: ""}, {name: b.example.com, extendedResourceName: gpu.example.com/gpu}]`,
			`deviceClasses[1].extendedResourceName: "gpu.example.com/gpu" is also the extended resource of deviceClasses[0]; a name can select one class only`},
		{"defaulted name invalid", `deviceClasses: [{name: gpu.kubernetes.io}]`,
			`deviceClasses[0].extendedResourceName: "gpu.kubernetes.io/gpu" is not an extended resource name`},
		{"kubernetes.io", `deviceClasses: [{extendedResourceName: kubernetes.io/gpu}]`, "/deviceClasses/0/extendedResourceName"},
		{"no domain", `deviceClasses: [{extendedResourceName: gpu}]`, "/deviceClasses/0/extendedResourceName"},
		{"quota prefix", `deviceClasses: [{extendedResourceName: requests.example.com/gpu}]`, "/deviceClasses/0/extendedResourceName"},
		{"upper-case domain", `deviceClasses: [{extendedResourceName: Example.com/gpu}]`, "/deviceClasses/0/extendedResourceName"},
		{"class name not a DNS name", `deviceClasses: [{name: GPU_class}]`, "/deviceClasses/0/name"},
		{"no classes", `deviceClasses: []`, "/deviceClasses"},
		{"unknown field", `deviceClasses: [{extendedResource: a.com/b}]`, "extendedResource"},
		{"config of another kind", `deviceClasses: [{config: [{apiVersion: gpu.resource.example.com/v1alpha1, kind: NicConfig}]}]`, "/deviceClasses/0/config/0/kind"},
		{"config strategy typo", `deviceClasses: [{config: [{apiVersion: gpu.resource.example.com/v1alpha1, kind: GpuConfig, sharing: {strategy: TimeSlice}}]}]`, "/deviceClasses/0/config/0/sharing/strategy"},
		{"empty selector", `deviceClasses: [{selectors: [""]}]`, "/deviceClasses/0/selectors/0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, capabilities(t, clusters[1]), valuesYAML(t, tc.values))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("err = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
