package claimadmission

import (
	"context"
	"errors"
	"slices"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra/internal/servedfeatures"
)

type fakeAdmin struct {
	support   servedfeatures.AdminAccessSupport
	probeErr  error
	labels    map[string]string
	getErr    error
	nsQueries int
}

func (f *fakeAdmin) AdminAccess(context.Context) (servedfeatures.AdminAccessSupport, error) {
	return f.support, f.probeErr
}

func (f *fakeAdmin) NamespaceLabels(context.Context, string) (map[string]string, error) {
	f.nsQueries++
	return f.labels, f.getErr
}

const (
	adminTemplateV1 = `
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: multiple-gpus-admin, namespace: team-a}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.example.com, allocationMode: All, adminAccess: true}`
	adminClaimV1Beta1 = `
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaim
metadata: {generateName: monitor-, namespace: team-a}
spec:
  devices:
    requests:
    - name: plain
      deviceClassName: gpu.example.com
    - name: gpu
      deviceClassName: gpu.example.com
      allocationMode: All
      adminAccess: true`
	plainClaimV1 = `
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: plain, namespace: team-a}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.example.com, adminAccess: false}`
)

func adminRequest(t *testing.T, manifest string) admission.Request {
	t.Helper()
	raw, err := yaml.YAMLToJSON([]byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	var tm struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
	}
	if err := yaml.Unmarshal(raw, &tm); err != nil {
		t.Fatal(err)
	}
	gvk := tm.GroupVersionKind()
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       "u",
		Kind:      metav1.GroupVersionKind{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind},
		Namespace: tm.Namespace,
		Name:      tm.Name,
		Operation: admissionv1.Create,
		Object:    runtime.RawExtension{Raw: raw},
	}}
}

// TestAdminAccessHandler: the handler denies exactly what the API server would refuse, with the
// command that fixes it, and stays out of the way whenever it cannot be sure.
func TestAdminAccessHandler(t *testing.T) {
	const fix = `ResourceClaimTemplate "multiple-gpus-admin" is invalid: spec.spec.devices.requests[0].exactly.adminAccess: Forbidden: admin access to devices requires the label resource.kubernetes.io/admin-access=true on namespace "team-a", which it lacks; a cluster administrator can add it with: kubectl label namespace team-a resource.kubernetes.io/admin-access=true`
	for _, tc := range []struct {
		name         string
		manifest     string
		admin        fakeAdmin
		wantAllowed  bool
		wantMessage  string
		wantWarnings []string
		wantQueries  int
	}{
		{name: "unlabelled namespace where the API server checks the label", manifest: adminTemplateV1,
			admin: fakeAdmin{support: servedfeatures.AdminAccessNeedsLabel}, wantMessage: fix, wantQueries: 1},
		{name: "label false", manifest: adminTemplateV1,
			admin: fakeAdmin{support: servedfeatures.AdminAccessNeedsLabel, labels: map[string]string{"resource.kubernetes.io/admin-access": "false"}}, wantMessage: fix, wantQueries: 1},
		{name: "labelled namespace", manifest: adminTemplateV1,
			admin: fakeAdmin{support: servedfeatures.AdminAccessNeedsLabel, labels: map[string]string{"resource.kubernetes.io/admin-access": "true"}}, wantAllowed: true, wantQueries: 1},
		{name: "v1beta1 claim, field path as written", manifest: adminClaimV1Beta1, admin: fakeAdmin{support: servedfeatures.AdminAccessNeedsLabel},
			wantMessage: `ResourceClaim "monitor-*" is invalid: spec.devices.requests[1].adminAccess: Forbidden: admin access to devices requires the label resource.kubernetes.io/admin-access=true on namespace "team-a", which it lacks; a cluster administrator can add it with: kubectl label namespace team-a resource.kubernetes.io/admin-access=true`,
			wantQueries: 1},
		{name: "no admin access asked", manifest: plainClaimV1, admin: fakeAdmin{support: servedfeatures.AdminAccessNeedsLabel}, wantAllowed: true},
		// 1.32 with the alpha gate: no label check in the API server, none here.
		{name: "served without a label check", manifest: adminTemplateV1, admin: fakeAdmin{support: servedfeatures.AdminAccessServed}, wantAllowed: true},
		{name: "dropped by the cluster", manifest: adminTemplateV1, admin: fakeAdmin{support: servedfeatures.AdminAccessDropped}, wantAllowed: true,
			wantWarnings: []string{"spec.spec.devices.requests[0].exactly.adminAccess: this cluster drops adminAccess (feature gate DRAAdminAccess is off), so the devices are allocated exclusively, as for any other request; enable DRAAdminAccess, or remove adminAccess"}},
		{name: "probe failed", manifest: adminTemplateV1, admin: fakeAdmin{probeErr: errors.New("etcd down")}, wantAllowed: true},
		{name: "namespace unreadable", manifest: adminTemplateV1, admin: fakeAdmin{support: servedfeatures.AdminAccessNeedsLabel, getErr: errors.New("forbidden")}, wantAllowed: true, wantQueries: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &AdminAccessHandler{Support: &tc.admin, Namespaces: &tc.admin}
			resp := h.Handle(context.Background(), adminRequest(t, tc.manifest))
			if resp.Allowed != tc.wantAllowed {
				t.Fatalf("allowed = %v, want %v: %+v", resp.Allowed, tc.wantAllowed, resp.Result)
			}
			if tc.wantMessage != "" && resp.Result.Message != tc.wantMessage {
				t.Errorf("message:\n got %s\nwant %s", resp.Result.Message, tc.wantMessage)
			}
			if !slices.Equal(resp.Warnings, tc.wantWarnings) {
				t.Errorf("warnings = %q, want %q", resp.Warnings, tc.wantWarnings)
			}
			if len(resp.Patches) > 0 {
				t.Errorf("a check in the mutating phase changed the object: %v", resp.Patches)
			}
			if tc.admin.nsQueries != tc.wantQueries {
				t.Errorf("%d namespace reads, want %d", tc.admin.nsQueries, tc.wantQueries)
			}
		})
	}
}
