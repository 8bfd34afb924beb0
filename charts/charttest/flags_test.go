package charttest

import (
	"errors"
	"flag"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/certs"
	"github.com/gpu-dra/gpu-dra/driver/app"
	"github.com/gpu-dra/gpu-dra/webhook/server"
)

// TestDaemonFlags: every container of the chart that runs gpu-kubelet-plugin or gpu-webhook
// passes flags that binary registers and accepts, in every golden rendering and with the
// optional flags on. A flag renamed in a binary but not in the chart fails here, not in a pod's
// CrashLoopBackOff.
func TestDaemonFlags(t *testing.T) {
	// What the downward API gives the containers.
	t.Setenv("NODE_NAME", "node-1")
	t.Setenv("POD_NAMESPACE", "gpu-dra")
	cases := goldenCases()
	cases = append(cases, struct {
		name  string
		c     cluster
		extra []string
		sets  []string
	}{name: "optional flags", c: clusters[2], sets: append(slices.Clone(installSets),
		"health.noExecuteKinds={xid,fallen-off}", "webhook.deny={missing-class,unsatisfiable}")})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRender(t, capabilities(t, tc.c, tc.extra...), values(t, tc.sets...))
			seen := map[string]int{}
			for _, m := range r.Manifests {
				for _, c := range podContainers(t, m) {
					if len(c.Command) == 0 {
						continue
					}
					if _, ok := daemons[c.Command[0]]; !ok {
						continue
					}
					seen[c.Command[0]]++
					if err := checkArgs(c.Command[0], c.Command[1:]); err != nil {
						t.Errorf("%s %s, container %s: %s refuses the chart's flags: %v", m.kind(), m.name(), c.Name, c.Command[0], err)
					}
				}
			}
			if seen["gpu-kubelet-plugin"] == 0 || seen["gpu-webhook"] == 0 {
				t.Errorf("containers checked per binary: %v; want both daemons", seen)
			}
		})
	}
}

// daemons register each binary's own flags (klog's aside) on fs, as its main does, and return
// the binary's validation of what fs parsed.
var daemons = map[string]func(fs *flag.FlagSet) (validate func() error){
	"gpu-kubelet-plugin": func(fs *flag.FlagSet) func() error {
		o := app.NewOptions()
		o.AddFlags(fs)
		return o.Validate
	},
	"gpu-webhook": func(fs *flag.FlagSet) func() error {
		o, c := server.NewOptions(), certs.NewOptions()
		o.AddFlags(fs)
		c.AddFlags(fs)
		return func() error { return errors.Join(o.Validate(), c.Validate()) }
	},
}

// checkArgs parses args with the binary's flags and klog's, then validates them.
func checkArgs(binary string, args []string) error {
	fs := flag.NewFlagSet(binary, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	klog.InitFlags(fs)
	validate := daemons[binary](fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	return validate()
}

// podContainers are the containers of a workload's pod template; none for other kinds.
func podContainers(t *testing.T, m manifest) []corev1.Container {
	var spec corev1.PodSpec
	switch m.kind() {
	case "Deployment":
		var d appsv1.Deployment
		decode(t, m, &d)
		spec = d.Spec.Template.Spec
	case "DaemonSet":
		var d appsv1.DaemonSet
		decode(t, m, &d)
		spec = d.Spec.Template.Spec
	case "Job":
		var j batchv1.Job
		decode(t, m, &j)
		spec = j.Spec.Template.Spec
	}
	return append(slices.Clone(spec.InitContainers), spec.Containers...)
}

// flagValue is the value of --name=value in args; empty without one.
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// TestFlagsDoc: docs/flags.md has one row per flag of each daemon, naming the daemon (or both)
// and the flag's default, and no row for a flag neither registers.
func TestFlagsDoc(t *testing.T) {
	// Unset, so the defaults are the binaries' own; the table names the variables instead.
	for _, env := range []string{"NODE_NAME", "POD_UID", "POD_NAMESPACE"} {
		t.Setenv(env, "")
	}
	doc, err := os.ReadFile("../../docs/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ daemon, def string }
	rows := map[string]row{}
	for _, line := range strings.Split(string(doc), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 6 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`--") {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`-")
		if _, dup := rows[name]; dup {
			t.Errorf("docs/flags.md: --%s has two rows", name)
		}
		rows[name] = row{daemon: strings.TrimSpace(cells[2]), def: strings.Trim(strings.TrimSpace(cells[3]), "`")}
	}
	registered := map[string]map[string]string{} // flag name -> binary -> default
	for binary, register := range daemons {
		fs := flag.NewFlagSet(binary, flag.ContinueOnError)
		register(fs)
		fs.VisitAll(func(f *flag.Flag) {
			if registered[f.Name] == nil {
				registered[f.Name] = map[string]string{}
			}
			registered[f.Name][binary] = f.DefValue
		})
	}
	short := map[string]string{"gpu-kubelet-plugin": "plugin", "gpu-webhook": "webhook"}
	for name, byBinary := range registered {
		r, ok := rows[name]
		if !ok {
			t.Errorf("docs/flags.md has no row for --%s", name)
			continue
		}
		want := "both"
		if len(byBinary) == 1 {
			for b := range byBinary {
				want = short[b]
			}
		}
		if r.daemon != want {
			t.Errorf("docs/flags.md: --%s is for %q, want %q", name, r.daemon, want)
		}
		for b, def := range byBinary {
			// A default taken from the environment or another flag is named, not spelled out.
			if r.def != def && !strings.HasPrefix(r.def, "$") && !strings.HasPrefix(r.def, "--") {
				t.Errorf("docs/flags.md: --%s defaults to %q, %s's to %q", name, r.def, b, def)
			}
		}
	}
	for name := range rows {
		if registered[name] == nil {
			t.Errorf("docs/flags.md has a row for --%s, which neither daemon registers", name)
		}
	}
}
