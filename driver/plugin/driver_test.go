package plugin

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra/driver/cdi"
	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
	"github.com/gpu-dra/gpu-dra/driver/simulated"
	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

const (
	testDriver = "gpu.example.com"
	testNode   = "node-a"
)

type harness struct {
	driver *Driver
	cdi    *cdi.Writer
	store  *checkpoint.Store
	dir    string
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	cdiDir, dataDir := t.TempDir(), t.TempDir()
	w, err := cdi.NewWriter(cdiDir, testDriver)
	if err != nil {
		t.Fatal(err)
	}
	store := checkpoint.NewStore(dataDir)
	d, err := NewDriver(ctx, testDriver, testNode, simulated.New(testNode, nodegroups.GroupSpec{}), w, store)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{driver: d, cdi: w, store: store, dir: dataDir}
}

func opaque(source resourceapi.AllocationConfigSource, requests []string, driver, params string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{
		Source:   source,
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(params)},
		}},
	}
}

const cfgHead = `"apiVersion":"gpu.resource.example.com/v1alpha1","kind":"GpuConfig"`

func gpuConfig(sharing string) string { return `{` + cfgHead + `,"sharing":` + sharing + `}` }

func claim(uid, name string, results []resourceapi.DeviceRequestAllocationResult, configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(uid)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: results, Config: configs},
		}},
	}
}

func result(request, device string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: request, Driver: testDriver, Pool: testNode, Device: device}
}

func TestPrepareConfigs(t *testing.T) {
	timeLong := gpuConfig(`{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}`)
	timeShort := gpuConfig(`{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Short"}}`)
	space := gpuConfig(`{"strategy":"SpacePartitioning","spacePartitioningConfig":{"partitionCount":3}}`)
	defaultSharing := checkpoint.Sharing{Strategy: "TimeSlicing", TimeSliceInterval: "Default"}
	tests := []struct {
		name    string
		claim   *resourceapi.ResourceClaim
		want    map[string]checkpoint.Sharing // device -> sharing
		wantErr []string
	}{
		{
			name:  "no config means default",
			claim: claim("u", "c", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0")}),
			want:  map[string]checkpoint.Sharing{"gpu-0": defaultSharing},
		},
		{
			name: "claim config wins over class config regardless of order",
			claim: claim("u", "c", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0")},
				opaque(resourceapi.AllocationConfigSourceClaim, nil, testDriver, space),
				opaque(resourceapi.AllocationConfigSourceClass, nil, testDriver, timeLong)),
			want: map[string]checkpoint.Sharing{"gpu-0": {Strategy: "SpacePartitioning", PartitionCount: 3}},
		},
		{
			name: "later claim config wins",
			claim: claim("u", "c", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0")},
				opaque(resourceapi.AllocationConfigSourceClaim, nil, testDriver, timeLong),
				opaque(resourceapi.AllocationConfigSourceClaim, nil, testDriver, timeShort)),
			want: map[string]checkpoint.Sharing{"gpu-0": {Strategy: "TimeSlicing", TimeSliceInterval: "Short"}},
		},
		{
			name: "config for one request only; parent request covers subrequest",
			claim: claim("u", "c", []resourceapi.DeviceRequestAllocationResult{result("a", "gpu-1"), result("b/small", "gpu-2")},
				opaque(resourceapi.AllocationConfigSourceClass, nil, testDriver, timeLong),
				opaque(resourceapi.AllocationConfigSourceClaim, []string{"b"}, testDriver, space)),
			want: map[string]checkpoint.Sharing{"gpu-1": {Strategy: "TimeSlicing", TimeSliceInterval: "Long"}, "gpu-2": {Strategy: "SpacePartitioning", PartitionCount: 3}},
		},
		{
			name: "other driver's config and devices are ignored",
			claim: claim("u", "c", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0"),
				{Request: "nic", Driver: "nic.example.com", Pool: "x", Device: "eth0"}},
				opaque(resourceapi.AllocationConfigSourceClaim, nil, "nic.example.com", `{"not":"ours"}`)),
			want: map[string]checkpoint.Sharing{"gpu-0": defaultSharing},
		},
		{
			name: "bad config names the field",
			claim: claim("u", "c", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0")},
				opaque(resourceapi.AllocationConfigSourceClass, nil, testDriver, timeLong),
				opaque(resourceapi.AllocationConfigSourceClaim, nil, testDriver, gpuConfig(`{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Forever"}}`))),
			wantErr: []string{"claim ns/c", "status.allocation.devices.config[1].opaque.parameters.sharing.timeSlicingConfig.interval", `"Forever"`},
		},
		{
			name: "unknown field names the field",
			claim: claim("u", "c", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0")},
				opaque(resourceapi.AllocationConfigSourceClaim, nil, testDriver, `{`+cfgHead+`,"sharring":{}}`)),
			wantErr: []string{"status.allocation.devices.config[0].opaque.parameters", `unknown field "sharring"`},
		},
		{
			name:    "device not on this node",
			claim:   claim("u", "c", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-8")}),
			wantErr: []string{"status.allocation.devices.results[0]", "node-a/gpu-8 is not a device of this node"},
		},
		{
			name: "device of another node's pool",
			claim: claim("u", "c", []resourceapi.DeviceRequestAllocationResult{
				{Request: "gpu", Driver: testDriver, Pool: "node-b", Device: "gpu-0"}}),
			wantErr: []string{"node-b/gpu-0 is not a device of this node"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			_, ctx := ktesting.NewTestContext(t)
			res, err := h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{tc.claim})
			if err != nil {
				t.Fatal(err)
			}
			r := res[tc.claim.UID]
			if len(tc.wantErr) > 0 {
				if r.Err == nil {
					t.Fatalf("prepare succeeded, want error with %q", tc.wantErr)
				}
				for _, s := range tc.wantErr {
					if !strings.Contains(r.Err.Error(), s) {
						t.Errorf("error %q lacks %q", r.Err, s)
					}
				}
				if h.cdi.Exists(tc.claim.UID) {
					t.Error("failed prepare left a CDI spec")
				}
				if prepared, _ := h.driver.PreparedClaims(ctx); len(prepared) != 0 {
					t.Error("failed prepare left a checkpoint entry")
				}
				return
			}
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			spec, err := h.cdi.Read(tc.claim.UID)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]checkpoint.Sharing{}
			for _, d := range spec.Devices {
				got[d.Device] = d.Sharing
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("sharing = %+v, want %+v", got, tc.want)
			}
			if len(r.Devices) != len(tc.want) {
				t.Errorf("returned %d devices, want %d", len(r.Devices), len(tc.want))
			}
			for _, d := range r.Devices {
				if want := []string{"k8s.gpu.example.com/gpu=" + string(tc.claim.UID) + "-" + d.DeviceName}; !slices.Equal(d.CDIDeviceIDs, want) {
					t.Errorf("CDI IDs %v, want %v", d.CDIDeviceIDs, want)
				}
			}
		})
	}
}

func TestPrepareIdempotent(t *testing.T) {
	h := newHarness(t)
	_, ctx := ktesting.NewTestContext(t)
	c := claim("uid-1", "c", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0"), result("gpu", "gpu-5")})
	first, err := h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if err != nil || first[c.UID].Err != nil {
		t.Fatal(err, first[c.UID].Err)
	}
	specBefore, _ := os.ReadFile(h.cdi.SpecPath(c.UID))
	// The kubelet retries after a restart; the claim may have changed in ways that do not matter
	// (e.g. reservedFor). The recorded result must come back unchanged.
	again := c.DeepCopy()
	again.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: "pod"}}
	second, err := h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{again})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(first, second) {
		t.Errorf("second prepare = %+v, first = %+v", second, first)
	}
	specAfter, _ := os.ReadFile(h.cdi.SpecPath(c.UID))
	if string(specBefore) != string(specAfter) {
		t.Error("spec rewritten on second prepare")
	}
	if uids, _ := h.cdi.List(); len(uids) != 1 {
		t.Errorf("%d specs, want 1", len(uids))
	}
	// A spec deleted behind our back is restored on the next prepare.
	_ = os.Remove(h.cdi.SpecPath(c.UID))
	third, _ := h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if !reflect.DeepEqual(first, third) || !h.cdi.Exists(c.UID) {
		t.Error("spec not restored")
	}

	// Unprepare removes spec and entry, and is idempotent.
	for i := 0; i < 2; i++ {
		res, err := h.driver.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: c.UID, NamespacedName: types.NamespacedName{Namespace: "ns", Name: "c"}}})
		if err != nil || res[c.UID] != nil {
			t.Fatalf("unprepare #%d: %v %v", i, err, res[c.UID])
		}
	}
	if h.cdi.Exists(c.UID) {
		t.Error("spec left after unprepare")
	}
	if prepared, _ := h.driver.PreparedClaims(ctx); len(prepared) != 0 {
		t.Errorf("checkpoint still holds %v", prepared)
	}
}

func TestPrepareEmptyIsNoop(t *testing.T) {
	h := newHarness(t)
	_, ctx := ktesting.NewTestContext(t)
	res, err := h.driver.PrepareResourceClaims(ctx, nil)
	if err != nil || len(res) != 0 {
		t.Fatalf("%v %v", res, err)
	}
	if _, err := os.Stat(h.store.Path()); !os.IsNotExist(err) {
		t.Error("empty prepare wrote a checkpoint")
	}
}

func TestPrepareRefusesDeviceInUse(t *testing.T) {
	h := newHarness(t)
	_, ctx := ktesting.NewTestContext(t)
	a := claim("uid-a", "a", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-1")})
	b := claim("uid-b", "b", []resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-1")})
	admin := result("gpu", "gpu-1")
	admin.AdminAccess = ptr.To(true)
	monitor := claim("uid-m", "monitor", []resourceapi.DeviceRequestAllocationResult{admin})
	prepare(t, h, a)

	res, err := h.driver.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{b, monitor})
	if err != nil {
		t.Fatal(err)
	}
	if err := res[b.UID].Err; err == nil || !strings.Contains(err.Error(), "device node-a/gpu-1 is already prepared for claim ns/a (uid uid-a)") {
		t.Errorf("second claim on gpu-1: %v", err)
	}
	if err := res[monitor.UID].Err; err != nil {
		t.Errorf("admin-access claim on gpu-1: %v", err)
	}
	if h.cdi.Exists(b.UID) {
		t.Error("refused claim got a CDI spec")
	}
	if _, err := h.driver.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: a.UID}}); err != nil {
		t.Fatal(err)
	}
	prepare(t, h, b)
}
