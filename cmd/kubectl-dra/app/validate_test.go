package app

import (
	"context"
	"encoding/json"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/analysis/claimvalidation"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/manifest"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
	"github.com/gpu-dra/gpu-dra/webhook/claimadmission"
)

const clusterStateFile = "testdata/validate/cluster-state.yaml"

// validateCase is one manifest judged against testdata/validate/cluster-state.yaml (offline) and
// against the same objects created in a real API server.
type validateCase struct {
	name string
	file string
	args []string
	code int
	// denied, warnings and errors hold substrings expected in the verdicts, in order.
	denied, warnings, errors []string
}

var validateCases = []validateCase{
	{name: "seed 1.32 template", file: filepath.Join(seedDir, "resourceclaimtemplate.v1beta1.yaml"),
		warnings: []string{"resource.k8s.io/v1beta1 ResourceClaimTemplate is deprecated and removed in Kubernetes 1.38; write it as resource.k8s.io/v1: "}},
	{name: "seed 1.34 template", file: filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml")},
	{name: "misspelt attribute, paths as written in v1beta1", file: "testdata/validate/typo.v1beta1.yaml", code: ExitDenied,
		denied:   []string{`spec.spec.devices.requests[0].selectors[0].cel.expression: unknown attribute "modle"; this driver publishes index, model, uuid, driverVersion, partitionable, partition, full`},
		warnings: []string{"deprecated"}},
	{name: "more devices than a node holds", file: "testdata/validate/nine.v1beta2.yaml", code: ExitDenied,
		denied:   []string{"spec.devices.requests[0].exactly.count: request gpus wants 9 devices, but no node of driver gpu.example.com holds more than 8"},
		warnings: []string{"deprecated"}},
	{name: "not enough old GPUs on one node", file: "testdata/validate/fiveold.v1.yaml",
		warnings: []string{"spec.spec.devices: nothing currently published can satisfy the claim: request gpus: 5 wanted, best node las4 has 4 matching"}},
	{name: "unsatisfiable denied by policy", file: "testdata/validate/fiveold.v1.yaml", args: []string{"--deny", "unsatisfiable"}, code: ExitDenied,
		denied: []string{"best node las4 has 4 matching"}},
	{name: "missing class", file: "testdata/validate/noclass.v1.yaml",
		warnings: []string{`spec.spec.devices.requests[0].exactly.deviceClassName: DeviceClass "gpu.example.org" does not exist`}},
	{name: "missing class denied by policy", file: "testdata/validate/noclass.v1.yaml", args: []string{"--deny", "missing-class"}, code: ExitDenied,
		denied: []string{`DeviceClass "gpu.example.org" does not exist`}},
	{name: "bad opaque config", file: "testdata/validate/badconfig.v1beta1.yaml", code: ExitDenied,
		denied:   []string{`spec.spec.devices.config[0].opaque.parameters.sharing.strategy: Unsupported value: "Magic"`},
		warnings: []string{"deprecated"}},
	{name: "1.32 layout under v1 is rejected before any webhook", file: "testdata/validate/half-upgraded.v1.yaml", code: ExitFailed,
		errors: []string{`unknown field "spec.spec.devices.requests[0].deviceClassName"`}},
	{name: "class shipped in the same file", file: "testdata/validate/bundle.yaml",
		warnings: []string{"deprecated"}},
	{name: "All mode and firstAvailable", file: "testdata/validate/all-and-first-available.v1beta1.yaml",
		warnings: []string{"deprecated", "deprecated"}},
	// Defaulted to count 1 before the allocator runs, as the API server would: las4 has one.
	{name: "one old GPU without a count", file: "testdata/validate/one-old.v1beta1.yaml", args: []string{"--deny", "unsatisfiable"},
		warnings: []string{"deprecated"}},
}

func TestValidateOffline(t *testing.T) {
	noCluster(t)
	for _, tc := range validateCases {
		t.Run(tc.name, func(t *testing.T) {
			rep := validateJSON(t, tc, "--cluster-state", clusterStateFile)
			if rep.ClusterState != "file:"+clusterStateFile {
				t.Errorf("inventory %q", rep.ClusterState)
			}
		})
	}
}

// TestValidateAgainstCluster: the same cases against a real API server holding the same
// ResourceSlices and DeviceClasses (created in the versions the cluster-state file uses), reached
// through a kubeconfig; the verdicts must equal the offline ones.
func TestValidateAgainstCluster(t *testing.T) {
	srv := testapiserver.Start(t)
	if n := createClusterState(t, srv, "v1beta1", "v1beta2", "v1"); n != 4 {
		t.Fatalf("created %d published objects, want 4", n)
	}
	kubeconfig := writeKubeconfig(t, srv.Config)
	t.Setenv("KUBECONFIG", "")
	for _, tc := range validateCases {
		t.Run(tc.name, func(t *testing.T) {
			live := validateJSON(t, tc, "--kubeconfig", kubeconfig)
			if live.ClusterState != "cluster" {
				t.Errorf("inventory %q, want cluster", live.ClusterState)
			}
			offline := validateJSON(t, tc, "--cluster-state", clusterStateFile)
			if !reflect.DeepEqual(live.Objects, offline.Objects) {
				t.Errorf("live and offline verdicts differ:\n live: %+v\n file: %+v", live.Objects, offline.Objects)
			}
		})
	}
}

// validateJSON runs validate -o json for tc and checks exit code and messages.
func validateJSON(t *testing.T, tc validateCase, extra ...string) report {
	t.Helper()
	args := append([]string{"validate", "-f", tc.file, "-o", "json"}, tc.args...)
	r := run(t, "", append(args, extra...)...)
	if r.code != tc.code {
		t.Errorf("exit %d, want %d; stderr:\n%s\nstdout:\n%s", r.code, tc.code, r.stderr, r.stdout)
	}
	var rep report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("-o json: %v\n%s", err, r.stdout)
	}
	var denied, warnings, errs []string
	for _, o := range rep.Objects {
		denied = append(denied, o.Denied...)
		warnings = append(warnings, o.Warnings...)
		if o.Error != "" {
			errs = append(errs, o.Error)
		}
		if o.Allowed != (len(o.Denied) == 0 && o.Error == "") {
			t.Errorf("%s: allowed=%t with denied %v, error %q", o.Name, o.Allowed, o.Denied, o.Error)
		}
	}
	matchAll(t, "denied", denied, tc.denied)
	matchAll(t, "warnings", warnings, tc.warnings)
	matchAll(t, "errors", errs, tc.errors)
	if rep.Allowed != (tc.code == 0) {
		t.Errorf("allowed=%t with exit %d", rep.Allowed, tc.code)
	}
	return rep
}

func matchAll(t *testing.T, what string, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: got %d %q, want %d matching %q", what, len(got), got, len(want), want)
		return
	}
	for i := range want {
		if !strings.Contains(got[i], want[i]) {
			t.Errorf("%s[%d] = %q, want it to contain %q", what, i, got[i], want[i])
		}
	}
}

func TestValidateText(t *testing.T) {
	noCluster(t)
	r := run(t, "", "validate", "-f", "testdata/validate/typo.v1beta1.yaml", "-f", filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml"), "--cluster-state", clusterStateFile)
	if r.code != ExitDenied {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{
		"DENIED ResourceClaimTemplate default/typo (resource.k8s.io/v1beta1, testdata/validate/typo.v1beta1.yaml document 1)\n  denied: spec.spec.devices.requests[0].selectors[0].cel.expression: unknown attribute \"modle\"",
		"\nADMITTED ResourceClaimTemplate example (resource.k8s.io/v1, ../../../e2e/testdata/seed/resourceclaimtemplate.v1.yaml document 1)\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
	if !strings.Contains(r.stderr, "1 of 2 object(s) would be denied") {
		t.Errorf("stderr: %s", r.stderr)
	}
}

// TestValidateWithoutClusterState: no --cluster-state and no cluster still runs the checks that
// need neither (CEL, opaque config, device count), and says what it skipped.
func TestValidateWithoutClusterState(t *testing.T) {
	noCluster(t)
	for _, tc := range []struct {
		file string
		code int
	}{
		{"testdata/validate/typo.v1beta1.yaml", ExitDenied},
		{"testdata/validate/noclass.v1.yaml", 0},
		{"testdata/validate/fiveold.v1.yaml", 0},
	} {
		r := run(t, "", "validate", "-f", tc.file)
		if r.code != tc.code || !strings.Contains(r.stderr, "DeviceClass and feasibility checks skipped") {
			t.Errorf("%s: exit %d, want %d\n%s", tc.file, r.code, tc.code, r.stderr)
		}
		if strings.Contains(r.stdout, "does not exist") || strings.Contains(r.stdout, "nothing currently published") {
			t.Errorf("%s: cluster-state checks ran without a cluster state:\n%s", tc.file, r.stdout)
		}
	}
}

func TestValidateBadInput(t *testing.T) {
	noCluster(t)
	for _, tc := range []struct {
		name   string
		args   []string
		stderr string
	}{
		{"cluster state with a Pod", []string{"-f", "testdata/validate/typo.v1beta1.yaml", "--cluster-state", "testdata/upgrade/pod.yaml"}, "v1 Pod is not a ResourceSlice, DeviceClass or Node"},
		{"unknown rule", []string{"-f", "testdata/validate/typo.v1beta1.yaml", "--deny", "typos"}, `unknown rule "typos"`},
		{"bad output", []string{"-f", "testdata/validate/typo.v1beta1.yaml", "-o", "yaml"}, `-o "yaml": use json`},
		{"unreachable named cluster", []string{"-f", "testdata/validate/typo.v1beta1.yaml", "--kubeconfig", "testdata/nope"}, "read the cluster's ResourceSlices and DeviceClasses"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, "", append([]string{"validate"}, tc.args...)...)
			if r.code != ExitFailed || !strings.Contains(r.stderr, tc.stderr) {
				t.Errorf("exit %d, stderr:\n%s\nwant %q", r.code, r.stderr, tc.stderr)
			}
		})
	}
}

// createClusterState creates the documents of the cluster-state file written in one of versions in the
// server, each in the version it is written in, and returns how many.
func createClusterState(t *testing.T, srv *testapiserver.Server, versions ...string) int {
	t.Helper()
	dyn, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	resources := map[string]string{resourceversion.KindResourceSlice: "resourceslices", resourceversion.KindDeviceClass: "deviceclasses"}
	n := 0
	for _, d := range manifest.Documents([]byte(readText(t, clusterStateFile))) {
		if !slices.Contains(versions, d.GVK.Version) {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := sigsyaml.Unmarshal(d.Raw, &u.Object); err != nil {
			t.Fatal(err)
		}
		gvr := schema.GroupVersionResource{Group: d.GVK.Group, Version: d.GVK.Version, Resource: resources[d.GVK.Kind]}
		if _, err := dyn.Resource(gvr).Create(context.Background(), u, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("create %s %s: %v", d.GVK, d.Name, err)
		}
		n++
	}
	return n
}

// TestValidateOn132Cluster: against a cluster serving only v1beta1 (Kubernetes 1.32), a v1
// manifest is reported as not applicable, with the command that fixes it, and v1beta1 manifests
// are judged against what the cluster publishes.
func TestValidateOn132Cluster(t *testing.T) {
	srv := testapiserver.Start(t, testapiserver.WithRuntimeConfig(testapiserver.V1Beta1Only))
	if n := createClusterState(t, srv, "v1beta1"); n != 2 {
		t.Fatalf("created %d published objects, want the class and las1's slice", n)
	}
	kubeconfig := writeKubeconfig(t, srv.Config)
	t.Setenv("KUBECONFIG", "")
	v1Seed := filepath.Join(seedDir, "resourceclaimtemplate.v1.yaml")
	for _, tc := range []validateCase{
		{name: "v1 manifest", file: v1Seed, code: ExitFailed,
			errors: []string{"the cluster does not serve resource.k8s.io/v1 (it serves resource.k8s.io/v1beta1); convert the manifest with: kubectl dra upgrade -f " + v1Seed}},
		{name: "seed 1.32 template", file: filepath.Join(seedDir, "resourceclaimtemplate.v1beta1.yaml"), warnings: []string{"deprecated"}},
		{name: "misspelt attribute", file: "testdata/validate/typo.v1beta1.yaml", code: ExitDenied, denied: []string{`unknown attribute "modle"`}, warnings: []string{"deprecated"}},
		// Only las1's GPUs (LATEST-GPU-MODEL) are published here.
		{name: "nothing old published", file: "testdata/validate/one-old.v1beta1.yaml", code: ExitDenied, args: []string{"--deny", "unsatisfiable"},
			denied: []string{"spec.devices: nothing currently published can satisfy the claim: request gpus: 1 wanted, no published device matches"}, warnings: []string{"deprecated"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			validateJSON(t, tc, "--kubeconfig", kubeconfig)
		})
	}
}

// TestValidateMatchesAdmission: for every case, the plugin's verdict is the admission
// response the webhook's handler gives for the same object and published objects.
func TestValidateMatchesAdmission(t *testing.T) {
	noCluster(t)
	state, err := inventory.Read([]byte(readText(t, clusterStateFile)))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range validateCases {
		t.Run(tc.name, func(t *testing.T) {
			rep := validateJSON(t, tc, "--cluster-state", clusterStateFile)
			deny, err := claimvalidation.ParseRules(strings.Join(flagValues(tc.args, "--deny"), ","))
			if err != nil {
				t.Fatal(err)
			}
			data := []byte(readText(t, tc.file))
			caseState := *state
			extra, err := inventory.Read(manifest.Filter(data, resourceversion.KindDeviceClass))
			if err != nil {
				t.Fatal(err)
			}
			caseState.Classes = append(append([]*resourceapi.DeviceClass{}, state.Classes...), extra.Classes...)
			h := &claimadmission.Handler{Validator: claimvalidation.New("gpu.example.com", nil, deny, &caseState)}
			i := 0
			for _, d := range manifest.Documents(data) {
				if d.GVK.Group != resourceversion.Group || (d.GVK.Kind != resourceversion.KindClaim && d.GVK.Kind != resourceversion.KindTemplate) {
					continue
				}
				v := rep.Objects[i]
				i++
				if v.Error != "" {
					// The API server rejects these before admission; nothing to compare.
					continue
				}
				raw, err := sigsyaml.YAMLToJSON(d.Raw)
				if err != nil {
					t.Fatal(err)
				}
				resp := h.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
					Operation: admissionv1.Create,
					Kind:      metav1.GroupVersionKind{Group: d.GVK.Group, Version: d.GVK.Version, Kind: d.GVK.Kind},
					Name:      d.Name, Namespace: d.Namespace,
					Object: runtime.RawExtension{Raw: raw},
				}})
				if resp.Allowed != v.Allowed || !reflect.DeepEqual(resp.Warnings, v.Warnings) {
					t.Errorf("%s: webhook allowed=%t warnings=%q; plugin allowed=%t warnings=%q", d.Name, resp.Allowed, resp.Warnings, v.Allowed, v.Warnings)
				}
				for _, m := range v.Denied {
					if resp.Result == nil || !strings.Contains(resp.Result.Message, m) {
						t.Errorf("%s: webhook message lacks %q: %+v", d.Name, m, resp.Result)
					}
				}
			}
			if i != len(rep.Objects) {
				t.Errorf("compared %d objects, the plugin judged %d", i, len(rep.Objects))
			}
		})
	}
}

func flagValues(args []string, name string) []string {
	var out []string
	for i := 0; i+1 < len(args); i++ {
		if args[i] == name {
			out = append(out, args[i+1])
		}
	}
	return out
}

// TestValidateFlags: --node-groups bounds what a node holds; the names of a release that never
// shipped (--inventory, --inventory-config) are unknown flags.
func TestValidateFlags(t *testing.T) {
	noCluster(t)
	args := []string{"validate", "-f", "testdata/validate/nine.v1beta2.yaml", "-o", "json"}
	now := run(t, "", append(args, "--cluster-state", clusterStateFile, "--node-groups", "testdata/validate/node-groups.yaml")...)
	if now.code != ExitDenied || !strings.Contains(now.stdout, "no node of driver gpu.example.com holds more than 4") {
		t.Fatalf("with --node-groups: exit %d, stdout:\n%s\nstderr:\n%s", now.code, now.stdout, now.stderr)
	}
	for _, old := range []string{"--inventory", "--inventory-config"} {
		got := run(t, "", append(args, old, clusterStateFile)...)
		if got.code == 0 || !strings.Contains(got.stderr, "unknown flag: "+old) {
			t.Errorf("%s: exit %d, stderr:\n%s", old, got.code, got.stderr)
		}
	}
}
