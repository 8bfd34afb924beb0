package framework

import "fmt"

// Pod manifests of the suites: busybox (imported into the node by the harness) sleeping long
// enough for any scenario, one container named app.
const podHead = `apiVersion: v1
kind: Pod
metadata:
  name: %s
%sspec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    imagePullPolicy: Never
    command: ["sh", "-c", "trap exit INT TERM; sleep 3600 & wait"]
`

// AnnotatedPod asks the webhook for count GPUs.
func AnnotatedPod(name string, count int) string {
	return fmt.Sprintf(podHead, name, fmt.Sprintf("  annotations:\n    gpu.example.com/count: %q\n", fmt.Sprint(count)))
}

// TemplatePod gets its GPU from a ResourceClaimTemplate, as the seed's pod does.
func TemplatePod(name, template string) string {
	return claimingPod(name, "resourceClaimTemplateName", template)
}

// ClaimPod shares an existing ResourceClaim.
func ClaimPod(name, claim string) string {
	return claimingPod(name, "resourceClaimName", claim)
}

func claimingPod(name, sourceField, source string) string {
	return fmt.Sprintf(podHead, name, "") + fmt.Sprintf(`    resources:
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    %s: %s
`, sourceField, source)
}
