package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
	"github.com/gpu-dra/gpu-dra/internal/analysis/diagnosis"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
	"github.com/gpu-dra/gpu-dra/internal/inventory"
	"github.com/gpu-dra/gpu-dra/internal/podgroups"
	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

type whyOptions struct {
	streams          genericiooptions.IOStreams
	flags            *genericclioptions.ConfigFlags
	clusterStateFile string
	driverName       string
	output           string
}

func newWhyCommand(streams genericiooptions.IOStreams, flags *genericclioptions.ConfigFlags) *cobra.Command {
	o := &whyOptions{streams: streams, flags: flags, driverName: deviceschema.DefaultDriverName}
	cmd := &cobra.Command{
		Use:   "why (pod/NAME | resourceclaim/NAME) [-n NAMESPACE] [-o json|yaml]",
		Short: "Explain why a pod or ResourceClaim gets no devices",
		Long: `For a Pending pod or an unallocated ResourceClaim, explains request by request and node
group by node group what keeps the claim from its devices: a DeviceClass that does not exist, a
selector that matches no published device (and which attribute value the devices have instead),
fewer matching devices on any node than requested, devices that other claims hold (and which),
taints, a matchAttribute constraint that cannot hold, partition counters used up; with the fix
where there is one. It runs the scheduler's allocator (k8s.io/dynamic-resource-allocation) with
the cluster's current allocations, so the answer agrees with the scheduler's.

It reads with your credentials: the pod and its claims, ResourceSlices and, where served,
DeviceTaintRules; for a claim that is not allocated also DeviceClasses, Nodes (names and labels)
and the allocations of the ResourceClaims in all namespaces. Lists go in pages (5,000 claims or
nodes, 1,000 slices a request; from the API server's watch cache on Kubernetes 1.34 and later). Or all of them from --cluster-state.
Causes in -o json: ` + strings.Join(causeNames(), ", ") + `.`,
		Example: `  # A pod stuck in Pending
  kubectl dra why pod/train-0 -n team-a

  # A claim, machine-readable
  kubectl dra why resourceclaim/big-gpus -n team-a -o json`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, name, err := parseTarget(args)
			if err != nil {
				return err
			}
			return o.run(cmd.Context(), kind, name)
		},
	}
	cmd.Flags().StringVarP(flags.Namespace, "namespace", "n", "", "namespace of the pod or claim (default: the kubeconfig context's)")
	cmd.Flags().StringVar(&o.clusterStateFile, "cluster-state", "", "read the pod, claims, ResourceSlices, DeviceClasses, DeviceTaintRules and Nodes (YAML) from this file instead of a cluster")
	cmd.Flags().StringVar(&o.driverName, "driver-name", o.driverName, "DRA driver whose attribute names selectors are checked against")
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "output format: json or yaml (default: text)")
	return cmd
}

func causeNames() []string {
	return []string{string(diagnosis.CauseNoSuchClass), string(diagnosis.CauseInvalidSelector), string(diagnosis.CauseNoMatch),
		string(diagnosis.CauseTooFew), string(diagnosis.CauseAllocated), string(diagnosis.CauseTainted), string(diagnosis.CauseCounters),
		string(diagnosis.CauseCapacity), string(diagnosis.CauseConstraint), string(diagnosis.CauseConflict),
		string(diagnosis.CauseAllocatable), string(diagnosis.CauseUnknown)}
}

const (
	targetPod   = "pod"
	targetClaim = "resourceclaim"
)

// parseTarget reads "pod/NAME", "resourceclaim/NAME" or the two as separate words, with the
// short and plural forms kubectl accepts.
func parseTarget(args []string) (string, string, error) {
	kind, name := "", ""
	if len(args) == 2 {
		kind, name = args[0], args[1]
	} else if k, n, ok := strings.Cut(args[0], "/"); ok {
		kind, name = k, n
	}
	switch strings.ToLower(kind) {
	case "pod", "pods", "po":
		kind = targetPod
	case "resourceclaim", "resourceclaims", "resourceclaim.resource.k8s.io":
		kind = targetClaim
	default:
		return "", "", fmt.Errorf("%q: name a pod or a claim: pod/NAME or resourceclaim/NAME", strings.Join(args, " "))
	}
	if name == "" {
		return "", "", fmt.Errorf("%q: the name is missing: %s/NAME", strings.Join(args, " "), kind)
	}
	return kind, name, nil
}

// whyReport is the answer; it is also the JSON output.
type whyReport struct {
	Pod    *podSummary   `json:"pod,omitempty"`
	Claims []claimReport `json:"claims"`
}

type podSummary struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Phase     string `json:"phase"`
	Node      string `json:"node,omitempty"`
	// Scheduler is the message of the pod's PodScheduled=False condition.
	Scheduler string `json:"schedulerMessage,omitempty"`
	// PodGroup is the group the pod names in spec.schedulingGroup; PodGroupNote what the
	// cluster makes of it where that matters (it serves no PodGroups).
	PodGroup     string `json:"podGroup,omitempty"`
	PodGroupNote string `json:"podGroupNote,omitempty"`
}

type claimReport struct {
	Namespace string `json:"namespace"`
	// Name is empty while the claim of a template is not created yet.
	Name     string `json:"name,omitempty"`
	PodClaim string `json:"podClaim,omitempty"`
	Template string `json:"template,omitempty"`
	// Allocated claims say where and what; the others why not.
	Allocated bool `json:"allocated"`
	// Nodes are where the allocated devices are.
	Nodes       []string             `json:"nodes,omitempty"`
	Devices     []string             `json:"devices,omitempty"`
	ReservedFor []string             `json:"reservedFor,omitempty"`
	Note        string               `json:"note,omitempty"`
	Diagnosis   *diagnosis.Diagnosis `json:"diagnosis,omitempty"`
}

func (o *whyOptions) run(ctx context.Context, kind, name string) error {
	switch o.output {
	case "", "json", "yaml":
	default:
		return fmt.Errorf("-o %q: use json or yaml, or leave it out for text", o.output)
	}
	oneShotGC()
	src, err := o.source()
	if err != nil {
		return err
	}
	return o.explain(ctx, src, kind, name)
}

// explain reads what the answer about kind/name needs from src and prints it.
func (o *whyOptions) explain(ctx context.Context, src *whySource, kind, name string) error {
	t, err := src.targets(ctx, kind, name)
	if err != nil {
		return err
	}
	// The cluster's allocations matter only to a claim that is not allocated: the others say
	// where their devices are, which the slices tell.
	state, err := src.state(ctx, t.needDiagnosis())
	if err != nil {
		return err
	}
	in := state.fleetInput()
	if in.Claims == nil && in.Kept == nil {
		in.Claims = t.known()
	}
	fl := deviceusage.Build(in)
	view := feasibility.New(&inventory.Objects{Slices: fl.Slices, Classes: state.Classes, Nodes: state.Nodes},
		celcheck.New(o.driverName, deviceschema.DeviceSchema()))
	rep := whyReport{Claims: []claimReport{}}
	if t.pod == nil {
		cr, err := explainClaim(ctx, view, fl, t.claims[0].claim)
		if err != nil {
			return err
		}
		rep.Claims = append(rep.Claims, cr)
	} else {
		rep.Pod = summarizePod(t.pod)
		rep.Pod.PodGroupNote = src.podGroupNote(rep.Pod.PodGroup)
		for i := range t.claims {
			cr, err := o.explainPodClaim(ctx, src, view, fl, t.pod, &t.claims[i])
			if err != nil {
				return err
			}
			rep.Claims = append(rep.Claims, cr)
		}
	}
	if o.output != "" {
		return printStructured(o.streams.Out, o.output, rep)
	}
	printWhy(o.streams.Out, rep)
	return nil
}

// whyTargets are what why is asked about: a claim, or a pod and the claims of its
// spec.resourceClaims, read one by one.
type whyTargets struct {
	pod    *corev1.Pod
	claims []podClaim
}

// podClaim is one entry of a pod's spec.resourceClaims and the claim behind it: claim is nil
// while the template's claim is not created (notCreated), when the entry needs none (name nil),
// or when the named claim does not exist.
type podClaim struct {
	entry      *corev1.PodResourceClaim
	name       *string
	notCreated bool
	claim      *resourceapi.ResourceClaim
	// err is resourceclaim.Name's answer for the entry, other than ErrClaimNotFound.
	err error
}

func (s *whySource) targets(ctx context.Context, kind, name string) (*whyTargets, error) {
	ns := s.namespace
	if kind != targetPod {
		c, err := s.claim(ctx, ns, name)
		if err != nil {
			return nil, err
		}
		if c == nil {
			return nil, fmt.Errorf("resourceclaim %q not found in namespace %q", name, ns)
		}
		return &whyTargets{claims: []podClaim{{claim: c}}}, nil
	}
	pod, err := s.pod(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	t := &whyTargets{pod: pod}
	for i := range pod.Spec.ResourceClaims {
		pc := podClaim{entry: &pod.Spec.ResourceClaims[i]}
		pc.name, _, err = resourceclaim.Name(pod, pc.entry)
		switch {
		case errors.Is(err, resourceclaim.ErrClaimNotFound):
			pc.notCreated = true
		case err != nil:
			pc.err = err
		case pc.name != nil:
			if pc.claim, err = s.claim(ctx, ns, *pc.name); err != nil {
				return nil, err
			}
		}
		t.claims = append(t.claims, pc)
	}
	return t, nil
}

// needDiagnosis tells whether a claim is to be diagnosed: one that is not allocated, or a
// template whose claim is not created yet.
func (t *whyTargets) needDiagnosis() bool {
	for _, pc := range t.claims {
		if pc.notCreated || pc.claim != nil && pc.claim.Status.Allocation == nil {
			return true
		}
	}
	return false
}

// known are the target claims that exist.
func (t *whyTargets) known() []*resourceapi.ResourceClaim {
	var out []*resourceapi.ResourceClaim
	for _, pc := range t.claims {
		if pc.claim != nil {
			out = append(out, pc.claim)
		}
	}
	return out
}

func summarizePod(pod *corev1.Pod) *podSummary {
	s := &podSummary{Namespace: pod.Namespace, Name: pod.Name, Phase: string(pod.Status.Phase), Node: pod.Spec.NodeName}
	if g := pod.Spec.SchedulingGroup; g != nil {
		s.PodGroup = ptr.Deref(g.PodGroupName, "")
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			s.Scheduler = strings.TrimSpace(c.Message)
		}
	}
	return s
}

// explainPodClaim explains one entry of pod.spec.resourceClaims: a named claim, the claim
// generated from a template, or, before the controller created it, the template's spec.
func (o *whyOptions) explainPodClaim(ctx context.Context, src *whySource, view *feasibility.View, fl *deviceusage.Fleet,
	pod *corev1.Pod, pclaim *podClaim) (claimReport, error) {
	pc := pclaim.entry
	switch {
	case pclaim.err != nil:
		return claimReport{}, pclaim.err
	case pclaim.notCreated:
		cr := claimReport{Namespace: pod.Namespace, PodClaim: pc.Name, Template: *pc.ResourceClaimTemplateName}
		t, err := src.template(ctx, pod.Namespace, *pc.ResourceClaimTemplateName)
		if err != nil {
			return claimReport{}, err
		}
		if t == nil {
			cr.Note = fmt.Sprintf("ResourceClaimTemplate %q does not exist, so no claim is created for the pod: create the template or fix spec.resourceClaims of the pod", cr.Template)
			return cr, nil
		}
		cr.Note = "the claim is not created yet; judging the template's spec"
		spec := t.Spec.Spec.DeepCopy()
		resourceversion.Default(spec)
		if cr.Diagnosis, err = diagnosis.Diagnose(ctx, view, pod.Namespace, spec, fl); err != nil {
			return claimReport{}, fmt.Errorf("ResourceClaimTemplate %s/%s: %w", pod.Namespace, cr.Template, err)
		}
		return cr, nil
	case pclaim.name == nil:
		return claimReport{Namespace: pod.Namespace, PodClaim: pc.Name, Note: "the pod needs no claim for this entry"}, nil
	}
	c := pclaim.claim
	if c == nil {
		return claimReport{Namespace: pod.Namespace, Name: *pclaim.name, PodClaim: pc.Name,
			Note: fmt.Sprintf("ResourceClaim %q does not exist: create it, or fix spec.resourceClaims of the pod", *pclaim.name)}, nil
	}
	cr, err := explainClaim(ctx, view, fl, c)
	cr.PodClaim = pc.Name
	if pc.ResourceClaimTemplateName != nil {
		cr.Template = *pc.ResourceClaimTemplateName
	}
	return cr, err
}

func explainClaim(ctx context.Context, view *feasibility.View, fl *deviceusage.Fleet, c *resourceapi.ResourceClaim) (claimReport, error) {
	cr := claimReport{Namespace: c.Namespace, Name: c.Name}
	for _, r := range c.Status.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" {
			cr.ReservedFor = append(cr.ReservedFor, "pod "+c.Namespace+"/"+r.Name)
			continue
		}
		cr.ReservedFor = append(cr.ReservedFor, r.Resource+" "+r.Name)
	}
	if c.DeletionTimestamp != nil {
		cr.Note = "the claim is being deleted"
	}
	if a := c.Status.Allocation; a != nil {
		cr.Allocated = true
		for _, r := range a.Devices.Results {
			cr.Devices = append(cr.Devices, r.Driver+"/"+r.Pool+"/"+r.Device)
			if d := fl.Device(structured.MakeDeviceID(r.Driver, r.Pool, r.Device)); d != nil && !slices.Contains(cr.Nodes, d.Node) {
				cr.Nodes = append(cr.Nodes, d.Node)
			}
		}
		return cr, nil
	}
	spec := c.Spec.DeepCopy()
	resourceversion.Default(spec)
	var err error
	if cr.Diagnosis, err = diagnosis.Diagnose(ctx, view, c.Namespace, spec, fl); err != nil {
		return claimReport{}, fmt.Errorf("ResourceClaim %s/%s: %w", c.Namespace, c.Name, err)
	}
	return cr, nil
}

// whySource is where why reads from: a cluster, or a --cluster-state file.
type whySource struct {
	namespace string
	client    *readClient
	file      *clusterState
	errOut    io.Writer
}

func (o *whyOptions) source() (*whySource, error) {
	if o.clusterStateFile != "" {
		data, err := os.ReadFile(o.clusterStateFile)
		if err != nil {
			return nil, fmt.Errorf("--cluster-state: %w", err)
		}
		state, err := readClusterState(data)
		if err != nil {
			return nil, fmt.Errorf("--cluster-state %s: %w", o.clusterStateFile, err)
		}
		ns := *o.flags.Namespace
		if ns == "" {
			ns = metav1.NamespaceDefault
		}
		return &whySource{namespace: ns, file: state}, nil
	}
	ns, _, err := o.flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, err
	}
	c, err := newReadClient(o.flags)
	if err != nil {
		return nil, err
	}
	return &whySource{namespace: ns, client: c, errOut: o.streams.ErrOut}, nil
}

// podGroupNote says, for a pod of PodGroup group on a live cluster, that the cluster serves no
// PodGroups: its claims are then its own and it is scheduled alone. A cluster state file holds no
// discovery, so it says nothing there.
func (s *whySource) podGroupNote(group string) string {
	if group == "" || s.client == nil {
		return ""
	}
	v, err := podgroups.ServedVersion(s.client.cs.Discovery())
	switch {
	case err != nil:
		return fmt.Sprintf("cannot tell whether the cluster serves PodGroups: %v", err)
	case v == "":
		return "this cluster serves no PodGroups (" + podgroups.Needs + "): the pod's claims are its own and it is scheduled alone"
	}
	return ""
}

func (s *whySource) pod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	if s.file != nil {
		for _, p := range s.file.Pods {
			if p.Namespace == ns && p.Name == name {
				return p, nil
			}
		}
		return nil, fmt.Errorf("pod %q not found in namespace %q", name, ns)
	}
	p, err := s.client.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", ns, name, err)
	}
	return p, nil
}

// template returns the named template, or nil when it does not exist.
func (s *whySource) template(ctx context.Context, ns, name string) (*resourceapi.ResourceClaimTemplate, error) {
	if s.file != nil {
		for _, t := range s.file.Templates {
			if t.Namespace == ns && t.Name == name {
				return t, nil
			}
		}
		return nil, nil
	}
	t, err := s.client.dra.ResourceClaimTemplates(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get ResourceClaimTemplate %s/%s: %w", ns, name, err)
	}
	return t, nil
}

// claim returns the named claim, or nil when it does not exist.
func (s *whySource) claim(ctx context.Context, ns, name string) (*resourceapi.ResourceClaim, error) {
	if s.file != nil {
		for _, c := range s.file.Claims {
			if c.Namespace == ns && c.Name == name {
				return c, nil
			}
		}
		return nil, nil
	}
	c, err := s.client.dra.ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get ResourceClaim %s/%s: %w", ns, name, err)
	}
	return c, nil
}

// state reads what the diagnosis looks at: the slices, and with diagnose the classes, nodes and
// every claim's allocation too.
func (s *whySource) state(ctx context.Context, diagnose bool) (*clusterState, error) {
	if s.file != nil {
		return s.file, nil
	}
	state, notes, err := s.client.list(ctx, listOptions{claims: diagnose, classes: diagnose, nodes: diagnose}, s.errOut)
	for _, n := range notes {
		fmt.Fprintf(s.errOut, "kubectl dra: %s\n", n)
	}
	return state, err
}
