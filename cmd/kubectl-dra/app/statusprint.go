package app

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/cli-runtime/pkg/printers"

	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
)

// maxNamesInLine bounds the names a one-line summary lists before "and N more".
const maxNamesInLine = 5

// printStatus writes the report as tables: one row per device and claim holding it (a free device
// has one row), so that grep for a node, device, claim or pod finds every line about it.
func printStatus(out io.Writer, rep *deviceusage.Report, wide bool) error {
	// Sections are separated by a blank line.
	printed := false
	section := func() {
		if printed {
			fmt.Fprintln(out)
		}
		printed = true
	}
	if len(rep.Nodes) > 0 {
		section()
		if err := printDevices(out, rep.Nodes, wide); err != nil {
			return err
		}
		section()
		// kubectl's tabwriter remembers column widths across flushes: each table gets its own.
		w := printers.GetNewTabWriter(out)
		printTotals(w, rep.Totals, wide)
		if err := w.Flush(); err != nil {
			return err
		}
	}
	if len(rep.CounterSets) > 0 {
		section()
		if err := printCounterSets(out, rep.CounterSets); err != nil {
			return err
		}
	}
	if len(rep.Unpublished) > 0 {
		section()
		fmt.Fprintln(out, "Allocated devices that no ResourceSlice publishes (their driver or node is gone):")
		for _, a := range rep.Unpublished {
			fmt.Fprintf(out, "  %s  %s\n", a.Device, a.Holder())
		}
	}
	if len(rep.Pending) > 0 {
		section()
		what := "claims wait"
		if len(rep.Pending) == 1 {
			what = "claim waits"
		}
		fmt.Fprintf(out, "%d %s for devices: %s. Ask why: kubectl dra why resourceclaim/NAME -n NAMESPACE\n",
			len(rep.Pending), what, joinMax(rep.Pending, maxNamesInLine))
	}
	return nil
}

// printDevices is the device table: one row per device and claim holding it.
func printDevices(out io.Writer, nodes []deviceusage.NodeReport, wide bool) error {
	w := printers.GetNewTabWriter(out)
	if wide {
		fmt.Fprintln(w, "NODE\tDRIVER\tPOOL\tDEVICE\tMODEL\tMEMORY\tHEALTH\tSTATE\tREQUEST\tSHARE\tCONSUMED\tCLAIM\tPODS")
	} else {
		fmt.Fprintln(w, "NODE\tDEVICE\tMODEL\tMEMORY\tHEALTH\tSTATE\tCLAIM\tPODS")
	}
	for _, n := range nodes {
		for _, d := range n.Devices {
			allocs := d.Allocations
			if len(allocs) == 0 {
				allocs = []deviceusage.Allocation{{}}
			}
			for _, a := range allocs {
				claim, pods := dash(a.Claim), dash(strings.Join(append(slices.Clone(a.Pods), a.Consumers...), ","))
				if a.AdminAccess {
					claim += " (admin access)"
				}
				if wide {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, d.Driver, d.Pool, d.Name, dash(d.Model), memory(d),
						health(d, true), d.State, dash(a.Request), dash(a.ShareID), dash(capacities(a.ConsumedCapacity)), claim, pods)
				} else {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, d.Name, dash(d.Model), memory(d), health(d, false), d.State, claim, pods)
				}
			}
		}
	}
	return w.Flush()
}

// printCounterSets is the table of the counter sets, one row per counter.
func printCounterSets(out io.Writer, sets []*deviceusage.CounterSet) error {
	w := printers.GetNewTabWriter(out)
	fmt.Fprintln(w, "COUNTER SET\tDRIVER\tPOOL\tCOUNTER\tUSED\tOF")
	for _, cs := range sets {
		names := make([]string, 0, len(cs.Counters))
		for n := range cs.Counters {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			c := cs.Counters[n]
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", cs.Name, cs.Driver, cs.Pool, n, c.Used.String(), c.Value.String())
		}
	}
	return w.Flush()
}

func printTotals(w io.Writer, totals []deviceusage.Total, wide bool) {
	blocked := wide
	for _, t := range totals {
		blocked = blocked || t.Blocked > 0
	}
	var cols []string
	if wide {
		cols = append(cols, "DRIVER")
	}
	cols = append(cols, "MODEL", "DEVICES", "FREE", "ALLOCATED")
	if blocked {
		cols = append(cols, "BLOCKED")
	}
	cols = append(cols, "UNHEALTHY")
	fmt.Fprintln(w, strings.Join(cols, "\t"))
	for _, t := range totals {
		var row []string
		if wide {
			row = append(row, t.Driver)
		}
		row = append(row, dash(t.Model), strconv.Itoa(t.Devices), strconv.Itoa(t.Free), strconv.Itoa(t.Allocated))
		if blocked {
			row = append(row, strconv.Itoa(t.Blocked))
		}
		row = append(row, strconv.Itoa(t.Unhealthy))
		fmt.Fprintln(w, strings.Join(row, "\t"))
	}
}

// health is "ok" or the device's taints; wide names the DeviceTaintRule of each added taint. A
// fault the driver's taints do not show yet (or cannot: the API server drops them) follows.
func health(d *deviceusage.Device, wide bool) string {
	if len(d.Taints) == 0 && d.Fault == "" {
		return "ok"
	}
	parts := make([]string, 0, len(d.Taints)+1)
	tainted := false
	for _, t := range d.Taints {
		s := t.String()
		if wide && t.Rule != "" {
			s += " (rule " + t.Rule + ")"
		}
		tainted = tainted || (t.Rule == "" && t.Key == d.Driver+"/unhealthy")
		parts = append(parts, s)
	}
	if d.Fault != "" && (!tainted || wide) {
		kind, msg, _ := strings.Cut(d.Fault, ": ")
		s := "fault " + kind
		if wide && msg != "" {
			s += " (" + msg + ")"
		}
		if !tainted {
			s += " (not tainted)"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ",")
}

func capacities(c map[resourceapi.QualifiedName]resource.Quantity) string {
	parts := make([]string, 0, len(c))
	for n, q := range c {
		parts = append(parts, string(n)+"="+q.String())
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// memory is the device's memory capacity and, for a shared device, what its shares use of it.
func memory(d *deviceusage.Device) string {
	if d.Memory == nil {
		return "-"
	}
	for n, q := range d.Consumed {
		if n == "memory" || n == resourceapi.QualifiedName(d.Driver+"/memory") {
			return fmt.Sprintf("%s (%s used)", d.Memory.String(), q.String())
		}
	}
	return d.Memory.String()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// joinMax lists at most n items, then says how many it left out.
func joinMax(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:n], ", ") + fmt.Sprintf(" and %d more", len(items)-n)
}
