package inventory

import (
	"testing"
)

// FuzzOwnAttributes: whatever a slice's devices carry as own attributes, each one the builder
// takes reads back with its name, value and kind exactly as published (a uuid packed to 16 bytes
// included), and the records of a device are found by its index.
func FuzzOwnAttributes(f *testing.F) {
	f.Add("uuid", "GPU-6f5d8c6e-1f0c-7f2e-5c1a-3b2c1d0e9f80", "serial", "SN-0001", false, uint8(3))
	f.Add("uuid", "6f5d8c6e-1f0c-7f2e-5c1a-3b2c1d0e9f8A", "driverVersion", "1.2.3", true, uint8(8))
	f.Add("uuid", "6f5d8c6e-1f0c-7f2e-5c1a-3b2c1d0e9f8", "pciBusID", "0000:00:1e.0", false, uint8(1))
	// A prefix before the uuid, kept once after the name; a second one under the same name.
	f.Add("uuid", "gpu-6f5d8c6e-1f0c-7f2e-5c1a-3b2c1d0e9f8", "uuid", "mig-6f5d8c6e-1f0c-7f2e-5c1a-3b2c1d0e9f80", false, uint8(8))
	f.Add("uuidgpu-", "6f5d8c6e-1f0c-7f2e-5c1a-3b2c1d0e9f8", "uuid", "gpu-6f5d8c6e-1f0c-7f2e-5c1a-3b2c1d0e9f80", true, uint8(2))
	f.Fuzz(func(t *testing.T, name1, value1, name2, value2 string, version bool, devices uint8) {
		type attr struct {
			device      int
			name, value string
			version     bool
		}
		var b ownBuilder
		var kept []attr
		for i := range int(devices%16) + 1 {
			// Each device's values differ, as own attributes do; the second is a version on
			// request.
			for _, a := range []attr{{i, name1, value1 + string(rune('a'+i%26)), false}, {i, name2, value2, version}} {
				if b.add(a.device, a.name, a.value, a.version) {
					kept = append(kept, a)
				}
			}
		}
		o := ownText(b.encoded())
		if o.count() != len(kept) {
			t.Fatalf("%d records, want %d", o.count(), len(kept))
		}
		for k, want := range kept {
			a := o.at(k)
			if a.device != want.device || a.version != want.version || o.name(&a) != want.name {
				t.Fatalf("record %d: device %d, name %q, version %v; want %+v", k, a.device, o.name(&a), a.version, want)
			}
			got := o.attribute(&a)
			v := got.StringValue
			if want.version {
				v = got.VersionValue
			}
			if v == nil || *v != want.value {
				t.Fatalf("record %d (%s): value %v, want %q", k, want.name, got, want.value)
			}
			if lo, hi := o.of(want.device); k < lo || k >= hi {
				t.Fatalf("record %d of device %d not among its records %d..%d", k, want.device, lo, hi)
			}
		}
	})
}
