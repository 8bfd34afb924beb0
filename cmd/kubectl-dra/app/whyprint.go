package app

import (
	"fmt"
	"io"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra/internal/analysis/diagnosis"
)

// maxGroupsShown bounds the node groups the text lists per request; -o json has all.
const maxGroupsShown = 5

func printWhy(out io.Writer, rep whyReport) {
	if p := rep.Pod; p != nil {
		line := fmt.Sprintf("Pod %s/%s: %s", p.Namespace, p.Name, p.Phase)
		if p.Node != "" {
			line += " on node " + p.Node
		}
		if p.Scheduler != "" {
			line += " (scheduler: " + oneLine(p.Scheduler) + ")"
		}
		fmt.Fprintln(out, line)
		if p.PodGroup != "" {
			group := "  in PodGroup " + p.PodGroup
			if p.PodGroupNote != "" {
				group += ", but " + p.PodGroupNote
			}
			fmt.Fprintln(out, group)
		}
		if len(rep.Claims) == 0 {
			fmt.Fprintln(out, "  the pod has no ResourceClaims: its devices are not what it waits for")
		}
	}
	for _, c := range rep.Claims {
		printClaim(out, c)
	}
}

func printClaim(out io.Writer, c claimReport) {
	var head string
	switch {
	case c.Name != "":
		head = fmt.Sprintf("ResourceClaim %s/%s", c.Namespace, c.Name)
	default:
		head = fmt.Sprintf("ResourceClaimTemplate %s/%s", c.Namespace, c.Template)
	}
	if c.PodClaim != "" {
		head += fmt.Sprintf(" (pod claim %q)", c.PodClaim)
	}
	switch {
	case c.Allocated:
		head += ": allocated"
		if len(c.Nodes) > 0 {
			head += " on " + strings.Join(c.Nodes, ", ")
		}
		head += ": " + strings.Join(c.Devices, ", ")
		if len(c.ReservedFor) > 0 {
			head += "; reserved for " + strings.Join(c.ReservedFor, ", ")
		}
	case c.Diagnosis != nil && c.Diagnosis.Allocatable:
		head += ": not allocated, but devices are free for it"
	case c.Diagnosis != nil:
		head += ": not allocated"
	}
	fmt.Fprintln(out, head)
	if c.Note != "" {
		fmt.Fprintf(out, "  %s\n", c.Note)
	}
	d := c.Diagnosis
	if d == nil {
		return
	}
	for _, r := range d.Requests {
		fmt.Fprintf(out, "  request %s: %s\n", r.Name, describeRequest(r))
		for _, f := range r.Findings {
			printFinding(out, "    ", f)
		}
		if r.Fits && len(r.Nodes) > 0 {
			fmt.Fprintf(out, "    fits alone: best node %s has %d available\n", r.Nodes[0].Nodes[0], r.Nodes[0].Available)
		}
		if len(r.Nodes) > 0 {
			fmt.Fprintln(out, "    nodes:")
			for i, g := range r.Nodes {
				if i == maxGroupsShown {
					fmt.Fprintf(out, "      and %d more groups of nodes (-o json lists them)\n", len(r.Nodes)-i)
					break
				}
				fmt.Fprintf(out, "      %s: %s\n", nodeList(g.Nodes), describeGroup(g))
			}
		}
	}
	if len(d.Findings) > 0 {
		fmt.Fprintln(out, "  claim:")
		for _, f := range d.Findings {
			printFinding(out, "    ", f)
		}
	}
}

func printFinding(out io.Writer, indent string, f diagnosis.Finding) {
	fmt.Fprintf(out, "%s%s: %s\n", indent, f.Cause, f.Message)
	for _, d := range f.Details {
		fmt.Fprintf(out, "%s  %s\n", indent, d)
	}
	if f.Fix != "" {
		fmt.Fprintf(out, "%s  fix: %s\n", indent, f.Fix)
	}
}

func describeRequest(r diagnosis.RequestDiagnosis) string {
	if r.AllocationMode == resourceapi.DeviceAllocationModeAll {
		return fmt.Sprintf("all matching devices of DeviceClass %s", r.DeviceClass)
	}
	unit := "devices"
	if r.Count == 1 {
		unit = "device"
	}
	return fmt.Sprintf("%d %s of DeviceClass %s", r.Count, unit, r.DeviceClass)
}

func describeGroup(g diagnosis.NodeGroup) string {
	parts := []string{fmt.Sprintf("%d matching", g.Matching)}
	for _, p := range []struct {
		n    int
		what string
	}{{g.Allocated, "allocated"}, {g.Tainted, "tainted"}, {g.CountersShort, "blocked by counters"}, {g.CapacityShort, "short of capacity"}} {
		if p.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", p.n, p.what))
		}
	}
	if g.Matching > 0 {
		parts = append(parts, fmt.Sprintf("%d available", g.Available))
	}
	return strings.Join(parts, ", ")
}

func nodeList(nodes []string) string {
	if len(nodes) == 1 {
		return nodes[0]
	}
	return fmt.Sprintf("%s (%d nodes)", joinMax(nodes, maxNamesInLine), len(nodes))
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
