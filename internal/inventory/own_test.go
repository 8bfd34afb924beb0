package inventory

import (
	"fmt"
	"testing"
)

// TestOwnUUIDPrefixOnce: the uuids of a slice's GPUs, each "gpu-" and a UUID, take their 16 bytes
// each and the prefix once, after the name: 8 of them are 202 bytes with the count and the records.
// With the prefix kept with each value they were 230, which put a slice of a typical name in the
// allocator's 320-byte class rather than its 288.
func TestOwnUUIDPrefixOnce(t *testing.T) {
	var b ownBuilder
	for i := range 8 {
		if !b.add(i, "uuid", fmt.Sprintf("gpu-6f5d8c6e-1f0c-7f2e-5c1a-3b2c1d0e9f8%d", i), false) {
			t.Fatalf("device %d: uuid not kept", i)
		}
	}
	o := ownText(b.encoded())
	if want := ownCountSize + 8*ownRecordSize + len("uuidgpu-") + 8*uuidBytes; len(o) != want {
		t.Errorf("8 uuids take %d bytes, want %d", len(o), want)
	}
	for k := range o.count() {
		a := o.at(k)
		if v := o.attribute(&a).StringValue; v == nil || *v != fmt.Sprintf("gpu-6f5d8c6e-1f0c-7f2e-5c1a-3b2c1d0e9f8%d", k) {
			t.Errorf("record %d reads back %v", k, v)
		}
	}
}
