package faults

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func known(devs ...string) Known {
	return func(d string) bool {
		for _, k := range devs {
			if k == d {
				return true
			}
		}
		return false
	}
}

func TestParseEntry(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	for _, tc := range []struct {
		name    string
		value   string
		want    Faults
		wantErr string
	}{
		{name: "empty", value: "", want: Faults{}},
		{name: "blank", value: "  \n", want: Faults{}},
		{name: "one fault", value: "gpu-1: {kind: xid, time: \"2026-12-03T10:00:00Z\", message: XID 79}\n",
			want: Faults{"gpu-1": {Kind: KindXID, Time: at, Message: "XID 79"}}},
		{name: "two faults, no message", value: "gpu-0: {kind: fallen-off, time: \"2026-12-03T10:00:00Z\"}\ngpu-1: {kind: xid, time: \"2026-12-03T10:00:00Z\"}\n",
			want: Faults{"gpu-0": {Kind: KindFallenOff, Time: at}, "gpu-1": {Kind: KindXID, Time: at}}},
		{name: "unknown device", value: "gpu-9: {kind: xid, time: \"2026-12-03T10:00:00Z\"}",
			wantErr: `entry "node1", device "gpu-9": no such device on this node`},
		{name: "unknown kind", value: "gpu-1: {kind: melted, time: \"2026-12-03T10:00:00Z\"}",
			wantErr: `entry "node1", device "gpu-1": kind: unknown fault kind "melted"; known kinds: xid, fallen-off`},
		{name: "missing time", value: "gpu-1: {kind: xid}",
			wantErr: `entry "node1", device "gpu-1": time is missing`},
		{name: "bad time", value: "gpu-1: {kind: xid, time: yesterday}",
			wantErr: `entry "node1" is not a map of device name to {kind, time, message}`},
		{name: "unknown field", value: "gpu-1: {kind: xid, time: \"2026-12-03T10:00:00Z\", severity: high}",
			wantErr: `entry "node1" is not a map of device name to {kind, time, message}`},
		{name: "garbage", value: "\x00\x01not yaml: [",
			wantErr: `entry "node1" is not a map`},
		{name: "a list", value: "- gpu-1\n- gpu-2\n",
			wantErr: `entry "node1" is not a map`},
		{name: "bad device name", value: "GPU_1: {kind: xid, time: \"2026-12-03T10:00:00Z\"}",
			wantErr: `device "GPU_1": not a device name`},
		{name: "long message", value: "gpu-1: {kind: xid, time: \"2026-12-03T10:00:00Z\", message: " + strings.Repeat("x", MaxMessageLength+1) + "}",
			wantErr: "message must be UTF-8 of at most 1024 bytes"},
		{name: "too big", value: strings.Repeat("#", MaxEntryBytes+1),
			wantErr: "more than 262144"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseEntry("node1", tc.value, known("gpu-0", "gpu-1", "GPU_1"))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				if got != nil {
					t.Errorf("faults %v returned with an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !got.Equal(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	in := Faults{
		"gpu-0": {Kind: KindFallenOff, Time: metav1.NewTime(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)), Message: "gone: \"quoted\"\nsecond line"},
		"gpu-7": {Kind: KindXID, Time: metav1.NewTime(time.Date(2026, 12, 3, 11, 0, 0, 0, time.UTC))},
	}
	s, err := in.Encode()
	if err != nil {
		t.Fatal(err)
	}
	out, err := ParseEntry("n", s, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, s)
	}
	if !out.Equal(in) {
		t.Errorf("round trip: got %v, want %v", out, in)
	}
	if s, _ := (Faults{}).Encode(); s != "" {
		t.Errorf("no faults encode as %q, want empty", s)
	}
}

func TestTooManyFaults(t *testing.T) {
	f := Faults{}
	for i := 0; i <= MaxFaultsPerNode; i++ {
		f["gpu-"+strings.Repeat("1", 1)+string(rune('a'+i%26))+strings.Repeat("0", i/26)] = Fault{Kind: KindXID, Time: metav1.Now()}
	}
	if err := f.Validate("n", nil); err == nil || !strings.Contains(err.Error(), "more than 1024") {
		t.Errorf("error %v, want too many faults", err)
	}
}

func FuzzParseEntry(f *testing.F) {
	f.Add("gpu-1: {kind: xid, time: \"2026-12-03T10:00:00Z\", message: XID 79}\n")
	f.Add("")
	f.Add("gpu-0: {kind: fallen-off, time: \"2026-12-03T10:00:00Z\"}")
	f.Add("- a\n- b")
	f.Add("gpu-1: {kind: xid, time: 12}")
	f.Fuzz(func(t *testing.T, value string) {
		faults, err := ParseEntry("node", value, nil)
		if err != nil {
			if faults != nil {
				t.Fatalf("faults %v with error %v", faults, err)
			}
			return
		}
		// Whatever parses is valid and survives a round trip.
		if err := faults.Validate("node", nil); err != nil {
			t.Fatalf("parsed faults do not validate: %v", err)
		}
		s, err := faults.Encode()
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseEntry("node", s, nil)
		if err != nil || !again.Equal(faults) {
			t.Fatalf("round trip: %v, %v (was %v)\n%s", again, err, faults, s)
		}
	})
}

// TestUnhealthy: an attach failure is a fault of the attach, not of the device.
func TestUnhealthy(t *testing.T) {
	at := metav1.Now()
	all := Faults{"gpu-0": {Kind: KindXID, Time: at}, "gpu-1": {Kind: KindFallenOff, Time: at}, "gpu-2": {Kind: KindAttachFailure, Time: at}}
	got := all.Unhealthy()
	if len(got) != 2 || got["gpu-0"].Kind != KindXID || got["gpu-1"].Kind != KindFallenOff {
		t.Errorf("Unhealthy() = %v, want gpu-0 and gpu-1 only", got)
	}
	if got := UnhealthyKindNames(); strings.Join(got, ",") != "xid,fallen-off" {
		t.Errorf("UnhealthyKindNames() = %v, want xid, fallen-off", got)
	}
	if _, err := ParseKind("attach-failure"); err != nil {
		t.Errorf("ParseKind(attach-failure): %v", err)
	}
}
