package upgradecheck

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The labels the gpu-dra chart puts on its objects (charts/gpu-dra/templates/_helpers.tpl).
const (
	chartLabel     = "helm.sh/chart"
	chartPrefix    = "gpu-dra-"
	releaseLabel   = "app.kubernetes.io/instance"
	versionLabel   = "app.kubernetes.io/version"
	componentLabel = "app.kubernetes.io/component"
)

// componentSelector finds the chart's workloads: the kubelet plugin's DaemonSet and the webhook's
// Deployment.
var componentSelector = componentLabel + " in (kubelet-plugin,webhook)," + chartLabel

// firstV1Only is the first gpu-dra release whose binaries discover the served resource.k8s.io
// versions at start and use the newest, so that they keep working when v1beta1 and v1beta2 are
// gone. Every release so far does.
var firstV1Only = [3]int{0, 1, 0}

func checkInstall(ctx context.Context, c Conn, o options) Install {
	in := Install{Status: Safe, Components: []Component{}}
	add := func(kind string, meta metav1.ObjectMeta, pod corev1.PodSpec) {
		if !strings.HasPrefix(meta.Labels[chartLabel], chartPrefix) {
			return
		}
		comp := Component{Kind: kind, Namespace: meta.Namespace, Name: meta.Name, Release: meta.Labels[releaseLabel],
			Chart: meta.Labels[chartLabel], Version: meta.Labels[versionLabel]}
		for _, ctr := range pod.Containers {
			comp.Images = append(comp.Images, ctr.Image)
		}
		comp.Status, comp.Note = supports(comp.Version)
		in.Status = worst(in.Status, comp.Status)
		in.Components = append(in.Components, comp)
	}
	err := pages(ctx, o, func(ctx context.Context, opts metav1.ListOptions) (string, error) {
		opts.LabelSelector = componentSelector
		l, err := c.Kube.AppsV1().DaemonSets("").List(ctx, opts)
		if err != nil {
			return "", err
		}
		for _, d := range l.Items {
			add("DaemonSet", d.ObjectMeta, d.Spec.Template.Spec)
		}
		return l.Continue, nil
	})
	if err == nil {
		err = pages(ctx, o, func(ctx context.Context, opts metav1.ListOptions) (string, error) {
			opts.LabelSelector = componentSelector
			l, err := c.Kube.AppsV1().Deployments("").List(ctx, opts)
			if err != nil {
				return "", err
			}
			for _, d := range l.Items {
				add("Deployment", d.ObjectMeta, d.Spec.Template.Spec)
			}
			return l.Continue, nil
		})
	}
	switch {
	case apierrors.IsForbidden(err):
		return Install{Status: Unknown, Components: in.Components, Reason: "may not list DaemonSets and Deployments in all namespaces (403 Forbidden)"}
	case err != nil:
		return Install{Status: Unknown, Components: in.Components, Reason: fmt.Sprintf("list the chart's DaemonSets and Deployments: %v", err)}
	case len(in.Components) == 0:
		in.Reason = "no gpu-dra release found (no DaemonSet or Deployment labelled " + chartLabel + "=" + chartPrefix + "*)"
	}
	return in
}

// supports judges an installed release by its app.kubernetes.io/version label.
func supports(version string) (Status, string) {
	v, ok := parseSemver(version)
	switch {
	case version == "":
		return Unknown, "no " + versionLabel + " label: cannot tell which release runs"
	case !ok:
		return Unknown, fmt.Sprintf("version %q is not a release number", version)
	case less(v, firstV1Only):
		return NotSafe, fmt.Sprintf("release %s predates %d.%d.%d, the first to run where only resource.k8s.io/v1 is served", version, firstV1Only[0], firstV1Only[1], firstV1Only[2])
	}
	return Safe, "discovers the served resource.k8s.io versions at start and uses the newest"
}

func parseSemver(s string) ([3]int, bool) {
	var out [3]int
	s = strings.TrimPrefix(s, "v")
	if i := strings.IndexAny(s, "-+"); i >= 0 {
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return out, false
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return out, false
		}
		out[i] = n
	}
	return out, true
}

func less(a, b [3]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}
