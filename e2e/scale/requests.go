package scale

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// loader sends the reviews: templates and pods created through the API server.
type loader struct {
	cs     kubernetes.Interface
	driver string
}

// templateSpecs are what a fleet's templates look like: whole GPUs, some of a given model or
// memory. A handful of distinct specs, as templates behind Deployments repeat.
func (l *loader) templateSpec(i int) resourceapi.ResourceClaimTemplateSpec {
	counts := []int64{1, 2, 4, 8}
	selectors := []string{
		"",
		fmt.Sprintf(`device.attributes["%s"].model == "H200-SXM-141GB"`, l.driver),
		fmt.Sprintf(`device.capacity["%s"].memory.compareTo(quantity("40Gi")) >= 0`, l.driver),
	}
	req := resourceapi.ExactDeviceRequest{DeviceClassName: l.driver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: counts[i%len(counts)]}
	if sel := selectors[(i/len(counts))%len(selectors)]; sel != "" {
		req.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: sel}}}
	}
	return resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}},
	}}}
}

// template creates a template with dryRun: the API server runs admission (the webhook's
// validation and its feasibility check) and stores nothing.
func (l *loader) template(ctx context.Context, i int) error {
	t := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{GenerateName: "scale-", Namespace: loadNamespace}, Spec: l.templateSpec(i)}
	_, err := l.cs.ResourceV1().ResourceClaimTemplates(loadNamespace).Create(ctx, t, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

func (l *loader) pod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, GenerateName: "scale-", Namespace: loadNamespace,
			Annotations: map[string]string{l.driver + "/count": "1"}, Labels: map[string]string{"app": "scale"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}}},
	}
}

// dryRunPod creates an annotated pod with dryRun: the webhook mutates it (its managed template
// exists after the first real pod, or is only planned on dry-run) and nothing is stored.
func (l *loader) dryRunPod(ctx context.Context, _ int) error {
	_, err := l.cs.CoreV1().Pods(loadNamespace).Create(ctx, l.pod(""), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}
