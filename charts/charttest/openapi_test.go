package charttest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/kube-openapi/pkg/spec3"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"
)

// The OpenAPI v3 documents of each Kubernetes release ship in the k8s.io/kubernetes module source
// (api/openapi-spec/v3). They come from the module cache (`go mod download`), so no network is
// needed once it is warm: `make deps` downloads the module of each tested release
// (hack/buildenv/build.env).

// openAPIDir returns api/openapi-spec/v3 of k8s.io/kubernetes at version.
func openAPIDir(t testing.TB, version string) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", "k8s.io/kubernetes@"+version)
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	_ = json.Unmarshal(out, &info)
	if err != nil || info.Dir == "" {
		msg := fmt.Sprintf("needs the OpenAPI specs of k8s.io/kubernetes@%s: `go mod download k8s.io/kubernetes@%s` failed: %v %s", version, version, err, info.Error)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED: " + msg)
	}
	return filepath.Join(info.Dir, "api", "openapi-spec", "v3")
}

// schemaSet resolves the schema of any kind of one Kubernetes release, fully expanded and strict:
// objects reject fields their schema does not declare (the API server drops or refuses them).
type schemaSet struct {
	dir      string
	mu       sync.Mutex
	docs     map[string]map[string]*spec.Schema // group-version file -> components
	expanded map[string]*spec.Schema
}

var schemaSets sync.Map // version -> *schemaSet

func schemasFor(t testing.TB, version string) *schemaSet {
	t.Helper()
	if s, ok := schemaSets.Load(version); ok {
		return s.(*schemaSet)
	}
	s := &schemaSet{dir: openAPIDir(t, version), docs: map[string]map[string]*spec.Schema{}, expanded: map[string]*spec.Schema{}}
	actual, _ := schemaSets.LoadOrStore(version, s)
	return actual.(*schemaSet)
}

func (s *schemaSet) components(gv string) (map[string]*spec.Schema, error) {
	if c, ok := s.docs[gv]; ok {
		return c, nil
	}
	file := "api__v1_openapi.json"
	if group, version, ok := strings.Cut(gv, "/"); ok {
		file = fmt.Sprintf("apis__%s__%s_openapi.json", group, version)
	}
	data, err := os.ReadFile(filepath.Join(s.dir, file))
	if err != nil {
		return nil, fmt.Errorf("this release does not serve %s: %w", gv, err)
	}
	var doc spec3.OpenAPI
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	s.docs[gv] = doc.Components.Schemas
	return doc.Components.Schemas, nil
}

// forKind finds the schema whose x-kubernetes-group-version-kind is apiVersion/kind.
func (s *schemaSet) forKind(apiVersion, kind string) (*spec.Schema, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	comps, err := s.components(apiVersion)
	if err != nil {
		return nil, err
	}
	group, version, ok := strings.Cut(apiVersion, "/")
	if !ok {
		group, version = "", apiVersion
	}
	for name, sch := range comps {
		gvks, _ := sch.Extensions["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			m, _ := g.(map[string]any)
			if m["group"] == group && m["version"] == version && m["kind"] == kind {
				return s.expand(comps, name, map[string]bool{}), nil
			}
		}
	}
	return nil, fmt.Errorf("%s does not define kind %s", apiVersion, kind)
}

// expand inlines every $ref (the validator does not follow them) and makes objects strict.
func (s *schemaSet) expand(comps map[string]*spec.Schema, name string, inProgress map[string]bool) *spec.Schema {
	if e, ok := s.expanded[name]; ok {
		return e
	}
	if inProgress[name] {
		return &spec.Schema{} // recursive types (none in the kinds the chart uses) accept anything
	}
	inProgress[name] = true
	defer delete(inProgress, name)
	src, ok := comps[name]
	if !ok {
		return &spec.Schema{}
	}
	out := s.expandSchema(comps, *src, inProgress)
	s.expanded[name] = out
	return out
}

func (s *schemaSet) expandSchema(comps map[string]*spec.Schema, in spec.Schema, inProgress map[string]bool) *spec.Schema {
	ref := func(r spec.Ref) string {
		return strings.TrimPrefix(r.String(), "#/components/schemas/")
	}
	if r := in.Ref.String(); r != "" {
		return s.expand(comps, ref(in.Ref), inProgress)
	}
	// OpenAPI v3 wraps a $ref in allOf to attach a description or default.
	if len(in.AllOf) == 1 && in.AllOf[0].Ref.String() != "" && len(in.Properties) == 0 && len(in.Type) == 0 {
		return s.expand(comps, ref(in.AllOf[0].Ref), inProgress)
	}
	out := in
	out.Default = nil
	out.Description = ""
	if in.Format == "int-or-string" {
		// Carried by oneOf [integer, string]; strfmt would apply it to strings only.
		out.Format = ""
	}
	if len(in.Properties) > 0 {
		out.Properties = make(map[string]spec.Schema, len(in.Properties))
		for k, p := range in.Properties {
			out.Properties[k] = *s.expandSchema(comps, p, inProgress)
		}
		preserve, _ := in.Extensions["x-kubernetes-preserve-unknown-fields"].(bool)
		if in.AdditionalProperties == nil && !preserve {
			out.AdditionalProperties = &spec.SchemaOrBool{Allows: false}
		}
	}
	if in.AdditionalProperties != nil && in.AdditionalProperties.Schema != nil {
		out.AdditionalProperties = &spec.SchemaOrBool{Allows: true, Schema: s.expandSchema(comps, *in.AdditionalProperties.Schema, inProgress)}
	}
	if in.Items != nil && in.Items.Schema != nil {
		out.Items = &spec.SchemaOrArray{Schema: s.expandSchema(comps, *in.Items.Schema, inProgress)}
	}
	for _, list := range []*[]spec.Schema{&out.AllOf, &out.OneOf, &out.AnyOf} {
		if len(*list) == 0 {
			continue
		}
		expanded := make([]spec.Schema, len(*list))
		for i, sub := range *list {
			expanded[i] = *s.expandSchema(comps, sub, inProgress)
		}
		*list = expanded
	}
	return &out
}

// validateObject checks one rendered object against its kind's schema in this release.
func (s *schemaSet) validateObject(m manifest) error {
	sch, err := s.forKind(m.apiVersion(), m.kind())
	if err != nil {
		return err
	}
	res := validate.NewSchemaValidator(sch, nil, "", strfmt.Default).Validate(m.Obj)
	if res.IsValid() {
		return nil
	}
	var msgs []string
	for _, e := range res.Errors {
		msgs = append(msgs, e.Error())
	}
	return fmt.Errorf("%s", strings.Join(msgs, "; "))
}

// nonKubernetesGroups are validated elsewhere (cert-manager's CRD schemas on a real API server).
var nonKubernetesGroups = []string{"cert-manager.io/"}

// TestOpenAPISchemas validates every object the chart renders for a cluster against the OpenAPI
// schemas of that Kubernetes release, for each certificate mode.
func TestOpenAPISchemas(t *testing.T) {
	modes := []struct {
		name   string
		extra  []string
		values string
		sets   []string
	}{
		{name: "self", sets: installSets},
		{name: "cert-manager", extra: []string{"cert-manager.io/v1"}, sets: []string{"certs.mode=cert-manager"}},
		{name: "secret", sets: []string{"certs.mode=secret", "certs.secret.name=tls", "certs.secret.caBundle=Q0EK", "webhook.deny={unsatisfiable}"}},
		{name: "network-policy", sets: append(slices.Clone(installSets), networkPolicySets...)},
		{name: "device-classes", values: deviceClassValues, sets: installSets},
	}
	for _, c := range clusters {
		t.Run(c.name, func(t *testing.T) {
			schemas := schemasFor(t, c.kubeVersion)
			for _, mode := range modes {
				t.Run(mode.name, func(t *testing.T) {
					r := mustRender(t, capabilities(t, c, mode.extra...), valuesYAML(t, mode.values, mode.sets...))
					checked := 0
					for _, m := range r.Manifests {
						skip := false
						for _, g := range nonKubernetesGroups {
							skip = skip || strings.HasPrefix(m.apiVersion(), g)
						}
						if skip {
							continue
						}
						if err := schemas.validateObject(m); err != nil {
							t.Errorf("%s %s/%s (%s) is invalid on Kubernetes %s: %v", m.Source, m.kind(), m.name(), m.apiVersion(), c.kubeVersion, err)
						}
						checked++
					}
					if checked < 15 {
						t.Errorf("validated only %d objects", checked)
					}
				})
			}
		})
	}
}

// TestOpenAPIValidatorCatchesMistakes proves the validation above can fail: objects with a typo,
// a wrong type, a missing required field, and a version the release does not serve.
func TestOpenAPIValidatorCatchesMistakes(t *testing.T) {
	r := mustRender(t, capabilities(t, clusters[0]), nil)
	ds, _ := r.find("DaemonSet", "")
	dc, _ := r.find("DeviceClass", "")
	mutate := func(m manifest, f func(obj map[string]any)) manifest {
		data, _ := json.Marshal(m.Obj)
		var obj map[string]any
		_ = json.Unmarshal(data, &obj)
		f(obj)
		return manifest{Obj: obj}
	}
	get := func(obj map[string]any, path ...string) map[string]any {
		for _, p := range path {
			obj = obj[p].(map[string]any)
		}
		return obj
	}
	for _, tc := range []struct {
		name    string
		version string
		m       manifest
		want    string
	}{
		{"unknown field", kubeOldest, mutate(ds, func(o map[string]any) { get(o, "spec")["updateStrategyy"] = map[string]any{} }), "updateStrategyy"},
		{"wrong type", kubeOldest, mutate(ds, func(o map[string]any) { get(o, "spec", "template", "spec")["hostNetwork"] = "yes" }), "hostNetwork"},
		{"missing required", kubeOldest, mutate(ds, func(o map[string]any) { delete(get(o, "spec"), "selector") }), "selector"},
		{"v1 on 1.32", kubeOldest, mutate(dc, func(o map[string]any) { o["apiVersion"] = "resource.k8s.io/v1" }), "resource.k8s.io/v1"},
		{"v1beta2 on 1.32", kubeOldest, mutate(dc, func(o map[string]any) { o["apiVersion"] = "resource.k8s.io/v1beta2" }), "resource.k8s.io/v1beta2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := schemasFor(t, tc.version).validateObject(tc.m)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
}
