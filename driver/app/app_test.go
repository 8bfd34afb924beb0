package app

import (
	"flag"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestValidate(t *testing.T) {
	good := Options{DriverName: "gpu.example.com", NodeName: "n", RegistrarDir: "/r", PluginsDir: "/p", HealthProbeBindAddress: ":8081", MetricsBindAddress: "127.0.0.1:8080"}
	tests := []struct {
		name    string
		mutate  func(*Options)
		wantErr string
	}{
		{name: "good", mutate: func(*Options) {}},
		{name: "no node", mutate: func(o *Options) { o.NodeName = "" }, wantErr: "--node-name: required (default $NODE_NAME)"},
		{name: "bad driver name", mutate: func(o *Options) { o.DriverName = "GPU_Example" }, wantErr: `--driver-name="GPU_Example"`},
		{name: "no plugins dir", mutate: func(o *Options) { o.PluginsDir = "" }, wantErr: "--kubelet-plugins-dir"},
		{name: "no-execute attach failures", mutate: func(o *Options) { o.NoExecuteFaultKinds = []string{"xid", "attach-failure"} },
			wantErr: "--no-execute-fault-kinds=xid,attach-failure: fault kind attach-failure never taints its device (it only fails attaches); remove it"},
		{name: "endpoints off", mutate: func(o *Options) { o.HealthProbeBindAddress, o.MetricsBindAddress = "0", "0" }},
		{name: "empty bind address", mutate: func(o *Options) { o.MetricsBindAddress = "" }, wantErr: `--metrics-bind-address="": missing port in address; use host:port or :port, e.g. :8080, or 0 to disable`},
		{name: "every error at once", mutate: func(o *Options) {
			o.NodeName, o.RegistrarDir, o.HealthProbeBindAddress, o.NoExecuteFaultKinds, o.FaultsConfigMap = "", "", "localhost", []string{"typo"}, "no-namespace"
		}, wantErr: "--node-name: required (default $NODE_NAME); set it from the downward API spec.nodeName\n" +
			"--kubelet-registrar-dir: must not be empty, e.g. /var/lib/kubelet/plugins_registry\n" +
			`--health-probe-bind-address="localhost": address localhost: missing port in address; use host:port or :port, e.g. :8080, or 0 to disable` + "\n" +
			`--no-execute-fault-kinds=typo: unknown fault kind "typo"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := good
			tc.mutate(&o)
			err := o.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestSocketPaths(t *testing.T) {
	o := Options{DriverName: "gpu.example.com", RegistrarDir: "/var/lib/kubelet/plugins_registry", PluginsDir: "/var/lib/kubelet/plugins"}
	if got := o.RegistrationSocket(); got != "/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock" {
		t.Errorf("registration socket %s", got)
	}
	if got := o.DRASocket(); got != "/var/lib/kubelet/plugins/gpu.example.com/dra.sock" {
		t.Errorf("DRA socket %s", got)
	}
	o.PodUID = "0b3d5f4e-2f0c-4e43-9d1a-4d1c2f7f6f11"
	if got := o.RegistrationSocket(); filepath.Dir(got) != o.RegistrarDir || !strings.Contains(got, o.PodUID) {
		t.Errorf("rolling-update registration socket %s", got)
	}
	if got := o.DRASocket(); filepath.Base(got) != "dra-"+o.PodUID+".sock" {
		t.Errorf("rolling-update DRA socket %s", got)
	}
}

func TestKubeletSupportsRollingUpdate(t *testing.T) {
	for v, want := range map[string]bool{
		"v1.32.13":        false,
		"v1.33.0":         true,
		"v1.34.2":         true,
		"v1.37.2-gke.100": true,
		"":                true, // unknown: a Node without status, assume current
	} {
		node := &corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: v}}}
		if got := kubeletSupportsRollingUpdate(node); got != want {
			t.Errorf("kubelet %q: %v, want %v", v, got, want)
		}
	}
}

func TestFlags(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		wantFile  string
		wantPoll  time.Duration
		wantKinds []string
		// status and metadata are on unless turned off
		wantNoStatus, wantNoMetadata bool
	}{
		{name: "defaults", wantPoll: 10 * time.Second},
		{name: "node groups", args: []string{"--node-groups=/etc/gpu-dra/groups.yaml", "--node-groups-poll-interval=1s"}, wantFile: "/etc/gpu-dra/groups.yaml", wantPoll: time.Second},
		{name: "no-execute kinds replaced", args: []string{"--no-execute-fault-kinds=xid", "--no-execute-fault-kinds=fallen-off, xid,"}, wantPoll: 10 * time.Second, wantKinds: []string{"fallen-off", "xid"}},
		{name: "claim status and device metadata off", args: []string{"--device-status=false", "--device-metadata=false"}, wantPoll: 10 * time.Second, wantNoStatus: true, wantNoMetadata: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(append([]string{"--node-name=n", "--kube-api-qps=7.5"}, tc.args...)); err != nil {
				t.Fatal(err)
			}
			if o.NodeGroupsFile != tc.wantFile || o.NodeGroupsPollInterval != tc.wantPoll {
				t.Errorf("node groups %q every %v, want %q every %v", o.NodeGroupsFile, o.NodeGroupsPollInterval, tc.wantFile, tc.wantPoll)
			}
			if !slices.Equal(o.NoExecuteFaultKinds, tc.wantKinds) {
				t.Errorf("no-execute fault kinds %q, want %q", o.NoExecuteFaultKinds, tc.wantKinds)
			}
			if o.DeviceStatus == tc.wantNoStatus || o.DeviceMetadata == tc.wantNoMetadata {
				t.Errorf("device status %v, metadata %v", o.DeviceStatus, o.DeviceMetadata)
			}
			if o.DriverName != "gpu.example.com" || o.NodeName != "n" || o.KubeAPIQPS != 7.5 || o.KubeAPIBurst != 100 {
				t.Errorf("options %+v", o)
			}
			if err := o.Validate(); err != nil {
				t.Error(err)
			}
		})
	}
}
