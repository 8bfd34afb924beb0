package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/cmd/kubectl-dra/app"
	"github.com/gpu-dra/gpu-dra/e2e/framework"
	"github.com/gpu-dra/gpu-dra/internal/analysis/diagnosis"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
)

// TestStatusAndWhy: `kubectl dra status` shows the seed's pod holding its GPU, and `kubectl dra
// why` names the cause for four pods that stay Pending while another claim holds all 8 GPUs: 9
// GPUs on a node of 8, a typo in the model, a matchAttribute constraint on the uuid (which could
// not hold with every GPU free either), and one GPU; in the text and, cause by cause, in -o json.
// The chart declares a group of 16-GPU nodes the cluster does not have, so that the webhook
// admits the 9-GPU claim (with its warning) instead of denying it.
func TestStatusAndWhy(t *testing.T) {
	c := framework.Setup(t)
	version := c.NewestResourceVersion(t)
	probe := filepath.Join("testdata", "seed", seedTemplate(version))
	installForTest(t, c, version,
		"--set", "inventory.nodeGroups[0].name=big",
		"--set", `inventory.nodeGroups[0].nodeSelector.gpu\.example\.com/group=big`,
		"--set", "inventory.nodeGroups[0].count=16")
	waitDevices(t, c, version, 8, "LATEST-GPU-MODEL")
	ns := c.Namespace(t, "why")
	dra := draclient.New(c.Clientset)

	t.Run("status shows the seed's pod on its GPU", func(t *testing.T) {
		c.Kubectl(t, "-n", ns, "apply", "-f", probe)
		c.Kubectl(t, "-n", ns, "apply", "-f", filepath.Join("testdata", "seed", "pod.yaml"))
		pod := c.WaitForPodPhase(t, ns, "example-claim", 2*time.Minute, corev1.PodRunning)
		claim := ns + "/" + *pod.Status.ResourceClaimStatuses[0].ResourceClaimName
		var rep deviceusage.Report
		if err := json.Unmarshal([]byte(kubectlDra(t, c, "status", "-o", "json")), &rep); err != nil {
			t.Fatal(err)
		}
		var holding []string
		for _, n := range rep.Nodes {
			for _, d := range n.Devices {
				for _, a := range d.Allocations {
					if a.Claim == claim && slices.Equal(a.Pods, []string{ns + "/example-claim"}) && d.State == deviceusage.StateAllocated {
						holding = append(holding, n.Name+"/"+d.Name)
					}
				}
			}
		}
		if len(holding) != 1 || len(rep.Totals) != 1 || rep.Totals[0].Allocated != 1 || rep.Totals[0].Free != 7 {
			t.Errorf("devices held by %s for the seed's pod: %v; totals %+v", claim, holding, rep.Totals)
		}
		if text := kubectlDra(t, c, "status"); !strings.Contains(text, claim) || !strings.Contains(text, ns+"/example-claim") {
			t.Errorf("status does not show %s and its pod:\n%s", claim, text)
		}
		// Its one-minute sleep must not free the GPU in the middle of what follows.
		c.Kubectl(t, "-n", ns, "delete", "pod", "example-claim", "--wait=true")
		waitClaimsGone(t, c, ns)
	})

	gpu := func(count int64, selectors ...string) *resourceapi.ExactDeviceRequest {
		r := &resourceapi.ExactDeviceRequest{DeviceClassName: driver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}
		for _, s := range selectors {
			r.Selectors = append(r.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
		}
		return r
	}
	create := func(t *testing.T, name string, devices resourceapi.DeviceClaim) {
		t.Helper()
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.ResourceClaimSpec{Devices: devices}}
		if _, err := dra.ResourceClaims(ns).Create(context.Background(), claim, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create claim %s: %v", name, err)
		}
		if out, err := c.KubectlStdin([]byte(framework.ClaimPod(name, name)), "-n", ns, "apply", "-f", "-"); err != nil {
			t.Fatalf("create pod %s: %v\n%s", name, err, out)
		}
	}
	t.Run("a claim holds every GPU", func(t *testing.T) {
		create(t, "hog", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "all",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driver, AllocationMode: resourceapi.DeviceAllocationModeAll}}}})
		c.WaitForPodPhase(t, ns, "hog", 2*time.Minute, corev1.PodRunning)
	})

	cases := []struct {
		pod     string
		devices resourceapi.DeviceClaim
		want    []string
		// causes are the findings' causes in -o json, requests first, then the claim's.
		causes []diagnosis.Cause
	}{
		{"nine", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpus", Exactly: gpu(9)}}},
			[]string{"TooFewDevices: 9 wanted, best node " + nodeName(t, c) + " has 8 matching", "fix: request at most 8"},
			[]diagnosis.Cause{diagnosis.CauseTooFew}},
		{"typo", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: gpu(1, `device.attributes["gpu.example.com"].model == "LATEST-GPU-MODLE"`)}}},
			[]string{"NoMatchingDevice: selector 0 matches none of the 8 devices", `did you mean "LATEST-GPU-MODEL"?`},
			[]diagnosis.Cause{diagnosis.CauseNoMatch}},
		{"pair", resourceapi.DeviceClaim{
			Requests:    []resourceapi.DeviceRequest{{Name: "a", Exactly: gpu(1)}, {Name: "b", Exactly: gpu(1)}},
			Constraints: []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(driver + "/uuid"))}}},
			// Behind the held GPUs: said for what it is, a constraint that could not hold anyway.
			[]string{"ConstraintUnsatisfiable: even with every device free, constraint matchAttribute gpu.example.com/uuid over requests a, b cannot hold"},
			[]diagnosis.Cause{diagnosis.CauseAllocated, diagnosis.CauseAllocated, diagnosis.CauseConstraint}},
		{"blocked", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: gpu(1)}}},
			[]string{"DevicesAllocated: 8 matching devices on node " + nodeName(t, c) + " are allocated to other claims", "held by " + ns + "/hog (pod " + ns + "/hog)"},
			[]diagnosis.Cause{diagnosis.CauseAllocated}},
	}
	for _, tc := range cases {
		create(t, tc.pod, tc.devices)
	}
	for _, tc := range cases {
		t.Run("why "+tc.pod, func(t *testing.T) {
			framework.Eventually(t, time.Minute, "the scheduler to give up on pod "+tc.pod, func() (bool, error) {
				p, err := c.Clientset.CoreV1().Pods(ns).Get(context.Background(), tc.pod, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				for _, cond := range p.Status.Conditions {
					if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse {
						return true, nil
					}
				}
				return false, nil
			})
			out := kubectlDra(t, c, "why", "pod/"+tc.pod, "-n", ns)
			t.Logf("kubectl dra why pod/%s:\n%s", tc.pod, out)
			for _, w := range append(tc.want, "Pod "+ns+"/"+tc.pod+": Pending (scheduler: ") {
				if !strings.Contains(out, w) {
					t.Errorf("why pod/%s lacks %q:\n%s", tc.pod, w, out)
				}
			}
			var rep struct {
				Claims []struct {
					Diagnosis *diagnosis.Diagnosis `json:"diagnosis"`
				} `json:"claims"`
			}
			j := kubectlDra(t, c, "why", "pod/"+tc.pod, "-n", ns, "-o", "json")
			if err := json.Unmarshal([]byte(j), &rep); err != nil {
				t.Fatalf("why -o json: %v\n%s", err, j)
			}
			var causes []diagnosis.Cause
			for _, cl := range rep.Claims {
				if cl.Diagnosis == nil {
					continue
				}
				for _, r := range cl.Diagnosis.Requests {
					for _, f := range r.Findings {
						causes = append(causes, f.Cause)
					}
				}
				for _, f := range cl.Diagnosis.Findings {
					causes = append(causes, f.Cause)
				}
			}
			if len(rep.Claims) != 1 || !slices.Equal(causes, tc.causes) {
				t.Errorf("why pod/%s -o json: %d claims, causes %v; want 1, %v\n%s", tc.pod, len(rep.Claims), causes, tc.causes, j)
			}
		})
	}
}

// kubectlDra runs `kubectl dra args...` against the cluster, in-process, and returns its output.
func kubectlDra(t *testing.T, c *framework.Cluster, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := app.NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(append(args, "--kubeconfig", c.Kubeconfig))
	start := time.Now()
	if err := cmd.Execute(); err != nil {
		t.Fatalf("kubectl dra %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	t.Logf("kubectl dra %s: %s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	return out.String()
}
