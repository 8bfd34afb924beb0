package app

import (
	"context"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1alpha3 "k8s.io/api/resource/v1alpha3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	draclient "k8s.io/dynamic-resource-allocation/client"

	"github.com/gpu-dra/gpu-dra/internal/testapiserver"
)

// createState creates a cluster-state file's objects in the server through the converting
// client, so that each lands in whichever resource.k8s.io version the server serves, with their
// status (allocations, reservations, pod phase and conditions) as the file has it. DeviceTaintRules
// are created as v1alpha3, the version a 1.34 server serves with DRADeviceTaints on.
func createState(t *testing.T, srv *testapiserver.Server, path string) {
	t.Helper()
	ctx := context.Background()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	state, err := readClusterState(data)
	if err != nil {
		t.Fatal(err)
	}
	cs := srv.Clientset
	dra := draclient.New(cs)
	namespaces := map[string]bool{}
	ensureNamespace := func(ns string) {
		if namespaces[ns] {
			return
		}
		namespaces[ns] = true
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		// No controller manager runs: the service account admission needs the account.
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("create %s: %v", what, err)
		}
	}
	for _, n := range state.Nodes {
		_, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		must("Node "+n.Name, err)
	}
	for _, c := range state.Classes {
		_, err := dra.DeviceClasses().Create(ctx, c, metav1.CreateOptions{})
		must("DeviceClass "+c.Name, err)
	}
	for _, s := range state.Slices {
		_, err := dra.ResourceSlices().Create(ctx, s, metav1.CreateOptions{})
		must("ResourceSlice "+s.Name, err)
	}
	for _, r := range state.TaintRules {
		alpha := &resourcev1alpha3.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: r.Name}}
		if s := r.Spec.DeviceSelector; s != nil {
			alpha.Spec.DeviceSelector = &resourcev1alpha3.DeviceTaintSelector{Driver: s.Driver, Pool: s.Pool, Device: s.Device}
		}
		alpha.Spec.Taint = resourcev1alpha3.DeviceTaint{Key: r.Spec.Taint.Key, Value: r.Spec.Taint.Value, Effect: resourcev1alpha3.DeviceTaintEffect(r.Spec.Taint.Effect)}
		_, err := cs.ResourceV1alpha3().DeviceTaintRules().Create(ctx, alpha, metav1.CreateOptions{})
		must("DeviceTaintRule "+r.Name, err)
	}
	for _, tmpl := range state.Templates {
		ensureNamespace(tmpl.Namespace)
		_, err := dra.ResourceClaimTemplates(tmpl.Namespace).Create(ctx, tmpl, metav1.CreateOptions{})
		must("ResourceClaimTemplate "+tmpl.Name, err)
	}
	for _, c := range state.Claims {
		ensureNamespace(c.Namespace)
		created, err := dra.ResourceClaims(c.Namespace).Create(ctx, c, metav1.CreateOptions{})
		must("ResourceClaim "+c.Name, err)
		if c.Status.Allocation != nil {
			created.Status = c.Status
			_, err = dra.ResourceClaims(c.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
			must("status of ResourceClaim "+c.Name, err)
		}
	}
	for _, p := range state.Pods {
		ensureNamespace(p.Namespace)
		created, err := cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		must("Pod "+p.Name, err)
		created.Status = p.Status
		_, err = cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
		must("status of Pod "+p.Name, err)
	}
}

// TestStatusAndWhyAgainstCluster: the hand-made states created in a real API server and read
// through a kubeconfig, with one list call per kind, give the answers the files give: on a 1.34
// server with DeviceTaintRules (v1alpha3), and on one serving only v1beta1 as 1.32 does.
func TestStatusAndWhyAgainstCluster(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  []testapiserver.Option
		state string
		runs  [][]string
	}{
		{name: "1.34 with DeviceTaintRules", state: whyBusy,
			opts: []testapiserver.Option{testapiserver.WithRuntimeConfig(testapiserver.AllVersions + ",resource.k8s.io/v1alpha3=true"), testapiserver.WithFeatureGates("DRADeviceTaints=true")},
			runs: [][]string{{"status", "-o", "wide"}, {"status", "-l", "gpu.example.com/group=old"}, {"status", "--node", "las1", "-o", "json"},
				{"why", "pod/latest"}, {"why", "pod/old"}, {"why", "resourceclaim/old-tolerant", "-o", "json"}}},
		{name: "1.32 serving v1beta1 only", state: whyCluster,
			opts: []testapiserver.Option{testapiserver.WithRuntimeConfig(testapiserver.V1Beta1Only)},
			runs: [][]string{{"status"}, {"why", "pod/nine"}, {"why", "pod/typo"}, {"why", "pod/pair"}, {"why", "pod/seed"}, {"why", "pod/waiting"}, {"why", "pod/orphan"},
				{"why", "resourceclaim/fallback", "-o", "json"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testapiserver.Start(t, tc.opts...)
			createState(t, srv, tc.state)
			kubeconfig := writeKubeconfig(t, srv.Config)
			t.Setenv("KUBECONFIG", "")
			for _, args := range tc.runs {
				live := run(t, "", append(args, "--kubeconfig", kubeconfig)...)
				file := run(t, "", append(args, "--cluster-state", tc.state)...)
				if live.code != 0 || live.stdout != file.stdout || live.stderr != "" {
					t.Errorf("%v: exit %d, stderr %q; live and file answers differ:\n live:\n%s\n file:\n%s", args, live.code, live.stderr, live.stdout, file.stdout)
				}
			}
		})
	}
}
