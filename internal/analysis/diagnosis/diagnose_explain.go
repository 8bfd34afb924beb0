package diagnosis

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/gpu-dra/gpu-dra/internal/analysis/celcheck"
	"github.com/gpu-dra/gpu-dra/internal/analysis/feasibility"
	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
)

// invalidSelectors reports selectors that do not compile or read what this driver never
// publishes: the allocator fails the whole claim on them, so nothing else is worth counting.
func (d *diagnoser) invalidSelectors(class *resourceapi.DeviceClass, r *feasibility.Request) ([]Finding, bool) {
	var out []Finding
	for i, e := range feasibility.ClassExprs(class) {
		if a := d.v.Checker().Analyze(e); a.CompileError != "" {
			out = append(out, Finding{Cause: CauseInvalidSelector, Message: fmt.Sprintf("selector %d of DeviceClass %q: %s", i, class.Name, a.CompileError),
				Fix: "fix the DeviceClass (its owner, usually the driver's chart)"})
		}
	}
	for i, sel := range r.Selectors {
		if sel.CEL == nil {
			continue
		}
		a := d.v.Checker().Analyze(sel.CEL.Expression)
		if a.CompileError != "" {
			out = append(out, Finding{Cause: CauseInvalidSelector, Message: fmt.Sprintf("selector %d: %s", i, a.CompileError)})
			continue
		}
		for _, issue := range a.Issues {
			out = append(out, Finding{Cause: CauseInvalidSelector, Message: fmt.Sprintf("selector %d: %s", i, issue)})
		}
	}
	return out, len(out) > 0
}

// noMatch finds the selector that matches none of the class's devices and what it reads: the
// values the devices have and, for a comparison with a literal no device has, the closest one.
func (d *diagnoser) noMatch(ctx context.Context, class *resourceapi.DeviceClass, r *feasibility.Request) Finding {
	cexprs := feasibility.ClassExprs(class)
	inClass, _ := d.v.Match(ctx, d.s, cexprs)
	total := inClass.Count()
	if total == 0 {
		return Finding{Cause: CauseNoMatch, Message: fmt.Sprintf("DeviceClass %q matches no published device", class.Name),
			Details: []string{"the class selects: " + strings.Join(cexprs, " && ")},
			Fix:     "check that the class's driver runs on the nodes and publishes devices: kubectl get resourceslices"}
	}
	f := Finding{Cause: CauseNoMatch}
	var counts []string
	culprit := -1
	for i, sel := range r.Selectors {
		if sel.CEL == nil {
			continue
		}
		m, ok := d.v.Match(ctx, d.s, append(slices.Clone(cexprs), sel.CEL.Expression))
		if !ok {
			continue
		}
		n := m.Count()
		counts = append(counts, fmt.Sprintf("selector %d matches %d of them: %s", i, n, sel.CEL.Expression))
		if n == 0 && culprit < 0 {
			culprit = i
		}
	}
	if culprit < 0 {
		f.Message = fmt.Sprintf("each selector matches some of the %d devices of DeviceClass %q, but no device matches all of them", total, class.Name)
		f.Details = counts
		f.Fix = "loosen one of the selectors"
		return f
	}
	expr := r.Selectors[culprit].CEL.Expression
	f.Message = fmt.Sprintf("selector %d matches none of the %d devices of DeviceClass %q: %s", culprit, total, class.Name, expr)
	a := d.v.Checker().Analyze(expr)
	for _, ref := range a.Refs {
		vals := d.values(inClass, ref)
		if len(vals) == 0 {
			f.Details = append(f.Details, fmt.Sprintf("no device of the class has %s", refName(ref)))
			if f.Fix == "" {
				f.Fix = fmt.Sprintf("select by what the devices publish: kubectl get resourceslices -o yaml lists it (%s is not there)", refName(ref))
			}
			continue
		}
		f.Details = append(f.Details, fmt.Sprintf("the devices have %s %s", refName(ref), describeValues(vals)))
	}
	for _, c := range a.Comparisons {
		if c.Op != "==" || f.Fix != "" {
			continue
		}
		want, ok := literalKey(c.Literal)
		vals := d.values(inClass, c.Ref)
		if !ok || len(vals) == 0 || slices.ContainsFunc(vals, func(v valueCount) bool { return v.key == want }) {
			continue
		}
		shown := make([]string, 0, len(vals))
		for _, v := range vals {
			shown = append(shown, v.shown)
		}
		lit := displayKey(want, c.Ref.Capacity)
		if best := closest(lit, shown); best != "" {
			f.Fix = fmt.Sprintf("no device has %s %s; did you mean %s?", refName(c.Ref), lit, best)
		} else {
			f.Fix = fmt.Sprintf("no device has %s %s; use one of %s", refName(c.Ref), lit, listMax(shown, maxListed))
		}
	}
	if f.Fix == "" {
		f.Fix = "change the selector to what the devices have (above)"
	}
	return f
}

// valueCount is one value of an attribute or capacity and on how many devices it is.
type valueCount struct {
	key, shown string
	devices    int
}

// values counts the values of ref on the devices dm matched, most common first.
func (d *diagnoser) values(dm *feasibility.Matches, ref celcheck.Ref) []valueCount {
	counts := map[string]int{}
	for i, m := range dm.Matched {
		if !m {
			continue
		}
		var v string
		var ok bool
		if ref.Capacity {
			v, ok = d.s.Capacity(i, ref.Domain, ref.Name)
		} else {
			v, ok = d.s.Attribute(i, ref.Domain, ref.Name)
		}
		if ok {
			counts[v]++
		}
	}
	out := make([]valueCount, 0, len(counts))
	for k, n := range counts {
		out = append(out, valueCount{key: k, shown: displayKey(k, ref.Capacity), devices: n})
	}
	slices.SortFunc(out, func(a, b valueCount) int {
		return cmp.Or(-cmp.Compare(a.devices, b.devices), cmp.Compare(a.shown, b.shown))
	})
	return out
}

func describeValues(vals []valueCount) string {
	parts := make([]string, 0, len(vals))
	for _, v := range vals {
		parts = append(parts, fmt.Sprintf("%s (%d)", v.shown, v.devices))
	}
	return listMax(parts, maxListed)
}

func refName(r celcheck.Ref) string {
	name := r.Domain + "/" + r.Name
	if r.Domain == "" {
		name = r.Name
	}
	if r.Capacity {
		return "capacity " + name
	}
	return name
}

// displayKey renders a value key (attrString's form, or a quantity) as CEL would write it.
func displayKey(key string, capacity bool) string {
	if capacity {
		return fmt.Sprintf("quantity(%q)", key)
	}
	if key == "" {
		return key
	}
	switch key[0] {
	case 's':
		return strconv.Quote(key[1:])
	case 'v':
		return fmt.Sprintf("semver(%q)", key[1:])
	case 'i', 'b':
		return key[1:]
	}
	return key
}

// literalKey is the value key (as attrString writes it) of a literal a selector compares with.
func literalKey(lit any) (string, bool) {
	switch v := lit.(type) {
	case string:
		return "s" + v, true
	case int64:
		return fmt.Sprintf("i%d", v), true
	case uint64:
		return fmt.Sprintf("i%d", v), true
	case bool:
		return fmt.Sprintf("b%t", v), true
	}
	return "", false
}

// obstacles explains why no node with enough matching devices has enough of them available.
func (d *diagnoser) obstacles(j *judged) []Finding {
	var nodes []int
	for n := range d.s.NumNodes() {
		if j.enough(n) {
			nodes = append(nodes, n)
		}
	}
	best := nodes[0]
	on := map[int]bool{}
	for _, n := range nodes {
		on[n] = true
		if j.available(n) > j.available(best) {
			best = n
		}
	}
	where := "on node " + d.s.NodeName(best)
	if len(nodes) > 1 {
		where = fmt.Sprintf("on the %d nodes with enough matching devices", len(nodes))
	}
	wanted := strconv.FormatInt(j.alt.Wanted, 10)
	if j.alt.Wanted < 0 {
		wanted = fmt.Sprintf("all %d matching", j.alt.Counts[best])
	}
	t := d.tally(j, on)
	bestLine := fmt.Sprintf("best node %s has %d available, %s wanted", d.s.NodeName(best), j.available(best), wanted)
	return d.obstacleFindings(j, t, where, bestLine, j.available(best))
}

// tally is what keeps the matching devices of some nodes from a request: how many devices each
// obstacle keeps, and the holders, taints, counter sets and capacities behind them.
type tally struct {
	count                               [numObstacles]int
	holders, taints, counters, capacity []string
	// taintedDevices are the devices of each taint.
	taintedDevices map[string][]string
}

// tally counts the obstacles of the request's matching devices on the nodes on.
func (d *diagnoser) tally(j *judged, on map[int]bool) *tally {
	t := &tally{taintedDevices: map[string][]string{}}
	seen := map[string]bool{}
	add := func(list *[]string, s string) {
		if !seen[s] && len(*list) < maxListed {
			seen[s] = true
			*list = append(*list, s)
		}
	}
	for di, o := range sortedObstacles(j.obstacles) {
		if o == obstacleNone || !slices.ContainsFunc(d.s.NodesOf(di), func(n int) bool { return on[n] }) {
			continue
		}
		t.count[o]++
		dev := d.devices.of(di)
		switch o {
		case obstacleAllocated:
			for _, a := range dev.Holders() {
				add(&t.holders, a.Holder())
			}
		case obstacleTainted:
			for _, taint := range untolerated(dev, j.Request) {
				s := taint.String()
				if taint.Rule != "" {
					s += " (DeviceTaintRule " + taint.Rule + ")"
				}
				if _, ok := t.taintedDevices[s]; !ok {
					t.taints = append(t.taints, s)
				}
				t.taintedDevices[s] = append(t.taintedDevices[s], deviceName(dev))
			}
		case obstacleCounters:
			for _, name := range dev.CountersShort {
				add(&t.counters, d.counterSet(dev, name))
			}
		case obstacleCapacity:
			add(&t.capacity, d.capacityShort(dev, j.Request))
		}
	}
	return t
}

// obstacleFindings are the findings of a tally, one per obstacle found, each with its fix;
// available is what the best node has available.
func (d *diagnoser) obstacleFindings(j *judged, t *tally, where, bestLine string, available int) []Finding {
	var out []Finding
	if n := t.count[obstacleAllocated]; n > 0 {
		f := Finding{Cause: CauseAllocated, Message: fmt.Sprintf("%s %s %s allocated to other claims; %s", plural(n, "matching device"), where, verb(n, "is", "are"), bestLine),
			Details: []string{"held by " + listMax(t.holders, maxListed)},
			Fix:     "wait for the pods holding them to finish, or delete those pods or claims"}
		if available > 0 && j.alt.Wanted > 0 {
			f.Fix += fmt.Sprintf("; or request at most %d", available)
		}
		out = append(out, f)
	}
	if n := t.count[obstacleTainted]; n > 0 {
		details := make([]string, 0, len(t.taints))
		for _, taint := range t.taints {
			devs := t.taintedDevices[taint]
			details = append(details, fmt.Sprintf("%s on %s: %s", taint, plural(len(devs), "device"), listMax(devs, maxListed)))
		}
		out = append(out, Finding{Cause: CauseTainted, Message: fmt.Sprintf("%s %s %s taints the request does not tolerate; %s", plural(n, "matching device"), where, verb(n, "has", "have"), bestLine),
			Details: details, Fix: tolerationFix(d, j)})
	}
	if n := t.count[obstacleCounters]; n > 0 {
		out = append(out, Finding{Cause: CauseCounters, Message: fmt.Sprintf("%s %s %s of GPUs whose counters allocated partitions use up; %s", plural(n, "matching device"), where, verb(n, "is a partition", "are partitions"), bestLine),
			Details: t.counters, Fix: "wait for the claims holding the other partitions, or request a smaller partition"})
	}
	if n := t.count[obstacleCapacity]; n > 0 {
		out = append(out, Finding{Cause: CauseCapacity, Message: fmt.Sprintf("%s %s %s too little capacity left; %s", plural(n, "matching shared device"), where, verb(n, "has", "have"), bestLine),
			Details: t.capacity, Fix: "request less capacity, or wait for other shares to end"})
	}
	return out
}

func deviceName(dev *deviceusage.Device) string {
	if dev.Node == deviceusage.AllNodes || dev.Node == deviceusage.SelectedNodes {
		return dev.Pool + "/" + dev.Name
	}
	return dev.Node + "/" + dev.Name
}

// untolerated are the device's taints that keep request r off it.
func untolerated(dev *deviceusage.Device, r *feasibility.Request) []deviceusage.Taint {
	var out []deviceusage.Taint
	for i, t := range dev.Published().Taints {
		if t.Effect != resourceapi.DeviceTaintEffectNoSchedule && t.Effect != resourceapi.DeviceTaintEffectNoExecute {
			continue
		}
		if !slices.ContainsFunc(r.Tolerations, func(tol resourceapi.DeviceToleration) bool { return resourceclaim.ToleratesTaint(tol, t) }) {
			out = append(out, dev.Taints[i])
		}
	}
	return out
}

// plural is "1 device" or "2 devices".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func verb(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// tolerationFix names the first untolerated taint's way out: clear it or tolerate it.
func tolerationFix(d *diagnoser, j *judged) string {
	for di, o := range sortedObstacles(j.obstacles) {
		if o != obstacleTainted {
			continue
		}
		taints := untolerated(d.devices.of(di), j.Request)
		if len(taints) == 0 {
			continue
		}
		t := taints[0]
		clear := "the driver clears its taints when the device recovers"
		if t.Rule != "" {
			clear = "kubectl delete devicetaintrule " + t.Rule
		}
		return fmt.Sprintf("clear the taint once the devices are fine (%s), or, if this workload may use them anyway, add to the request: tolerations: [{key: %q, operator: Exists, effect: %s}]",
			clear, t.Key, t.Effect)
	}
	return ""
}

func (d *diagnoser) counterSet(dev *deviceusage.Device, name string) string {
	for _, cs := range d.fl.CounterSets {
		if cs.Driver != dev.Driver || cs.Pool != dev.Pool || cs.Name != name {
			continue
		}
		names := make([]string, 0, len(cs.Counters))
		for n := range cs.Counters {
			names = append(names, n)
		}
		slices.Sort(names)
		parts := make([]string, 0, len(names))
		for _, n := range names {
			c := cs.Counters[n]
			parts = append(parts, fmt.Sprintf("%s %s of %s used", n, c.Used.String(), c.Value.String()))
		}
		return fmt.Sprintf("counter set %s of pool %s: %s", name, dev.Pool, strings.Join(parts, ", "))
	}
	return "counter set " + name + " of pool " + dev.Pool
}

func (d *diagnoser) capacityShort(dev *deviceusage.Device, r *feasibility.Request) string {
	var parts []string
	names := make([]string, 0, len(dev.Published().Capacity))
	for n := range dev.Published().Capacity {
		names = append(names, string(n))
	}
	slices.Sort(names)
	for _, n := range names {
		c := dev.Published().Capacity[resourceapi.QualifiedName(n)]
		left := c.Value.DeepCopy()
		if used, ok := dev.Consumed[resourceapi.QualifiedName(n)]; ok {
			left.Sub(used)
		}
		s := fmt.Sprintf("%s %s of %s left", n, left.String(), c.Value.String())
		if r.Capacity != nil {
			if q, ok := r.Capacity.Requests[resourceapi.QualifiedName(n)]; ok {
				s += ", " + q.String() + " requested"
			}
		}
		parts = append(parts, s)
	}
	return deviceName(dev) + ": " + strings.Join(parts, "; ")
}

// closest returns the option nearest to s by edit distance (case-insensitive), if it is near
// enough to be a typo of it; "" otherwise.
func closest(s string, options []string) string {
	best, bestDist := "", -1
	for _, o := range options {
		if dist := editDistance(strings.ToLower(s), strings.ToLower(o)); bestDist < 0 || dist < bestDist {
			best, bestDist = o, dist
		}
	}
	if bestDist < 0 || bestDist > max(2, len(s)/4) {
		return ""
	}
	return best
}

// editDistance is the Levenshtein distance of a and b, by bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
