package claimadmission

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation"
	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation/claimvalidationtest"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

var versions = []string{"v1beta1", "v1beta2", "v1"}

// checkDeprecation verifies the deprecation warning and that the v1 form it offers is the object.
func checkDeprecation(t *testing.T, warning string, version string, want *resourceversion.Object) {
	t.Helper()
	prefix := "resource.k8s.io/" + version + " " + want.Arrived.Kind + " is deprecated and removed in Kubernetes 1.38; write it as resource.k8s.io/v1: "
	if !strings.HasPrefix(warning, prefix) {
		t.Fatalf("deprecation warning\n got: %s\nwant prefix: %s", warning, prefix)
	}
	got, err := resourceversion.Decode([]byte(strings.TrimPrefix(warning, prefix)), schema.GroupVersionKind{})
	if err != nil {
		t.Fatalf("v1 form in the warning does not decode: %v", err)
	}
	if got.Arrived.Version != "v1" || !reflect.DeepEqual(got.Spec(), want.Spec()) {
		t.Errorf("v1 form in the warning differs from the object:\n got: %+v\nwant: %+v", got.Spec(), want.Spec())
	}
}

func TestRules(t *testing.T) {
	cases := claimvalidationtest.RuleCases(t, testdata)
	inv := loadInventory(t)
	for _, tc := range cases {
		h := &Handler{Validator: newValidator(t, inv, tc.Deny...)}
		for _, version := range versions {
			if tc.BetaOnly && version == "v1" {
				continue
			}
			t.Run(tc.Name+"/"+version, func(t *testing.T) {
				obj := claimvalidationtest.AsVersion(t, tc.Object, version)
				want, err := resourceversion.Decode(tc.Object, schema.GroupVersionKind{})
				if err != nil {
					t.Fatal(err)
				}
				resp := review(t, h, obj, admissionv1.Create)
				exactly := "exactly."
				if version == "v1beta1" {
					exactly = ""
				}
				expand := func(in []string) []string {
					var out []string
					for _, s := range in {
						out = append(out, strings.ReplaceAll(s, "{exactly}", exactly))
					}
					return out
				}
				wantWarnings := expand(tc.Warnings)
				wantDenied := expand(tc.Denied)
				deprecated := version != "v1" && !tc.NotOurs
				if deprecated && containsRule(tc.Deny, claimvalidation.RuleDeprecatedVersion) {
					wantDenied = append(wantDenied, "<deprecation>")
				} else if deprecated {
					wantWarnings = append(wantWarnings, "<deprecation>")
				}
				// Check the deprecation text separately: it embeds the whole object.
				gotWarnings := resp.Warnings
				if deprecated && !containsRule(tc.Deny, claimvalidation.RuleDeprecatedVersion) {
					if len(gotWarnings) == 0 {
						t.Fatalf("no deprecation warning")
					}
					checkDeprecation(t, gotWarnings[len(gotWarnings)-1], version, want)
					gotWarnings = append(gotWarnings[:len(gotWarnings)-1:len(gotWarnings)-1], "<deprecation>")
				}
				if strings.Join(gotWarnings, "\n") != strings.Join(wantWarnings, "\n") {
					t.Errorf("warnings\n got: %q\nwant: %q", gotWarnings, wantWarnings)
				}
				wantAllowed := len(wantDenied) == 0 && len(tc.DeniedPrefix) == 0
				if resp.Allowed != wantAllowed {
					t.Fatalf("allowed = %t, want %t (result %+v)", resp.Allowed, wantAllowed, resp.Result)
				}
				if wantAllowed {
					return
				}
				msg := resp.Result.Message
				head := obj.GetObjectKind().GroupVersionKind().Kind + ` "` + want.Name() + `" is invalid: `
				if !strings.HasPrefix(msg, head) {
					t.Fatalf("message %q does not start with %q", msg, head)
				}
				parts := strings.Split(strings.TrimPrefix(msg, head), "; ")
				if len(tc.DeniedPrefix) > 0 {
					for i, p := range expand(tc.DeniedPrefix) {
						if i >= len(parts) || !strings.HasPrefix(parts[i], p) {
							t.Errorf("denial %d = %q, want prefix %q", i, parts, p)
						}
					}
					return
				}
				got := strings.TrimPrefix(msg, head)
				if containsRule(tc.Deny, claimvalidation.RuleDeprecatedVersion) && deprecated {
					i := strings.Index(got, "resource.k8s.io/"+version)
					if i < 0 {
						t.Fatalf("denial %q lacks the deprecation", got)
					}
					checkDeprecation(t, got[i:], version, want)
					got = got[:i] + "<deprecation>"
				}
				if w := strings.Join(wantDenied, "; "); got != w {
					t.Errorf("denial\n got: %s\nwant: %s", got, w)
				}
			})
		}
	}
}

func containsRule(rules []claimvalidation.Rule, r claimvalidation.Rule) bool {
	for _, x := range rules {
		if x == r {
			return true
		}
	}
	return false
}

// TestValidCorpus: every valid manifest is admitted without a warning in v1, and with only the
// deprecation warning in the beta versions.
func TestValidCorpus(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(testdata, "valid", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus: %v", err)
	}
	h := &Handler{Validator: newValidator(t, loadInventory(t), claimvalidation.Rules...)}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		orig, err := resourceversion.Decode(raw, schema.GroupVersionKind{})
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var v1obj runtime.Object = orig.Claim
		if orig.Template != nil {
			v1obj = orig.Template
		}
		v1json, err := json.Marshal(v1obj)
		if err != nil {
			t.Fatal(err)
		}
		for _, version := range versions {
			t.Run(filepath.Base(f)+"/"+version, func(t *testing.T) {
				obj := claimvalidationtest.AsVersion(t, v1json, version)
				// Deny every rule: any finding at all shows up as a denial.
				resp := review(t, h, obj, admissionv1.Create)
				if version == "v1" {
					if !resp.Allowed || len(resp.Warnings) > 0 {
						t.Fatalf("allowed=%t warnings=%q result=%+v", resp.Allowed, resp.Warnings, resp.Result)
					}
					return
				}
				if resp.Allowed || !strings.Contains(resp.Result.Message, "is deprecated and removed in Kubernetes 1.38") || strings.Count(resp.Result.Message, "; write it as") != 1 {
					t.Fatalf("want only the deprecation denial, got allowed=%t %q", resp.Allowed, resp.Result.Message)
				}
				if strings.Contains(strings.SplitN(resp.Result.Message, "resource.k8s.io/"+version, 2)[0], ": ") != true {
					t.Fatalf("unexpected message %q", resp.Result.Message)
				}
			})
		}
		// The file as written (the seed's v1beta1 form stays v1beta1).
		t.Run(filepath.Base(f)+"/as-written", func(t *testing.T) {
			ho := &Handler{Validator: newValidator(t, loadInventory(t))}
			obj, _, err := unstructuredFor(raw)
			if err != nil {
				t.Fatal(err)
			}
			resp := review(t, ho, obj, admissionv1.Create)
			if !resp.Allowed {
				t.Fatalf("denied: %s", resp.Result.Message)
			}
			wantWarnings := 0
			if orig.Deprecated() {
				wantWarnings = 1
			}
			if len(resp.Warnings) != wantWarnings {
				t.Fatalf("warnings %q, want %d", resp.Warnings, wantWarnings)
			}
		})
	}
}

// TestUnsatisfiableOnEmptyCluster: the same valid claim warns when nothing is published.
func TestUnsatisfiableOnEmptyCluster(t *testing.T) {
	inv := loadInventory(t)
	inv.Slices = nil
	inv.Nodes = nil
	h := &Handler{Validator: newValidator(t, inv)}
	resp := review(t, h, validObject(t, "seed-v1"), admissionv1.Create)
	want := []string{"spec.spec.devices: nothing currently published can satisfy the claim: request example-claim: 1 wanted, no published device matches its class and selectors"}
	if !resp.Allowed || !reflect.DeepEqual(resp.Warnings, want) {
		t.Fatalf("allowed=%t warnings=%q, want %q", resp.Allowed, resp.Warnings, want)
	}
}

// TestOnlyCreateIsJudged: an object the webhook denies on CREATE passes any other operation
// untouched, as the chart registers CREATE only.
func TestOnlyCreateIsJudged(t *testing.T) {
	h := &Handler{Validator: newValidator(t, loadInventory(t), claimvalidation.Rules...)}
	raw, err := os.ReadFile(filepath.Join(testdata, "valid", "seed-v1beta1.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	obj, _, err := unstructuredFor(raw)
	if err != nil {
		t.Fatal(err)
	}
	if resp := review(t, h, obj, admissionv1.Create); resp.Allowed {
		t.Fatalf("create of a v1beta1 object with --deny=deprecated-version was allowed")
	}
	for _, op := range []admissionv1.Operation{admissionv1.Update, admissionv1.Delete, admissionv1.Connect} {
		resp := review(t, h, obj, op)
		if !resp.Allowed || len(resp.Warnings) > 0 || len(resp.Patch) > 0 || (resp.Result != nil && resp.Result.Message != "") {
			t.Errorf("%s: allowed=%t warnings=%q result=%+v, want allowed untouched", op, resp.Allowed, resp.Warnings, resp.Result)
		}
	}
}

func TestMalformedAndForeignRequests(t *testing.T) {
	h := &Handler{Validator: newValidator(t, loadInventory(t))}
	for _, tc := range []struct {
		name    string
		body    string
		allowed bool
		code    int32
	}{
		{name: "not json", body: `{`, code: 400},
		// controller-runtime hands an empty request to the handler, which has nothing to judge.
		{name: "no request", allowed: true, body: `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`},
		{name: "pod passes", allowed: true, body: `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE","object":{"apiVersion":"v1","kind":"Pod"}}}`},
		{name: "delete passes", allowed: true, body: `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","kind":{"group":"resource.k8s.io","version":"v1","kind":"ResourceClaim"},"operation":"DELETE"}}`},
		{name: "garbage object", code: 400, body: `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","kind":{"group":"resource.k8s.io","version":"v1","kind":"ResourceClaim"},"operation":"CREATE","object":{"spec":{"devices":{"requests":"x"}}}}}`},
		{name: "unknown version", allowed: true, body: `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","kind":{"group":"resource.k8s.io","version":"v9","kind":"ResourceClaim"},"operation":"CREATE","object":{}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := postRaw(t, h, []byte(tc.body))
			if resp.Allowed != tc.allowed {
				t.Fatalf("allowed = %t, want %t (%+v)", resp.Allowed, tc.allowed, resp.Result)
			}
			if tc.code != 0 && (resp.Result == nil || resp.Result.Code != tc.code) {
				t.Fatalf("result %+v, want code %d", resp.Result, tc.code)
			}
		})
	}
}

// TestDenialBounds: a claim with more findings than a denial names is refused in the shape and
// within the bounds of every denial of the webhook: ten findings, then a count of the rest.
func TestDenialBounds(t *testing.T) {
	var requests []string
	for i := range 12 {
		requests = append(requests, fmt.Sprintf(`{"name": "r%d", "exactly": {"deviceClassName": "gpu.example.com", "selectors": [{"cel": {"expression": "device.attributes[\"gpu.example.com\"].modle == \"x\""}}]}}`, i))
	}
	raw := []byte(`{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"generateName": "many-", "namespace": "default"}, "spec": {"devices": {"requests": [` + strings.Join(requests, ",") + `]}}}`)
	obj, _, err := unstructuredFor(raw)
	if err != nil {
		t.Fatal(err)
	}
	resp := review(t, &Handler{Validator: newValidator(t, loadInventory(t))}, obj, admissionv1.Create)
	msg := resp.Result.Message
	if resp.Allowed || !strings.HasPrefix(msg, `ResourceClaim "many-*" is invalid: spec.devices.requests[0].exactly.selectors[0].cel.expression: unknown attribute "modle"; `) ||
		!strings.Contains(msg, "spec.devices.requests[9].") || strings.Contains(msg, "spec.devices.requests[10].") || !strings.HasSuffix(msg, "; and 2 more errors") {
		t.Errorf("allowed=%t message %s", resp.Allowed, msg)
	}
}
