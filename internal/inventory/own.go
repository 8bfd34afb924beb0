package inventory

import (
	"encoding/binary"
	"math"
	"sort"

	resourceapi "k8s.io/api/resource/v1"
)

// own is a count (ownCountSize bytes), the records (ownRecordSize bytes each), then the text: the
// attribute names, each once, and the values. A record is a string or version attribute of one
// device: its device (with ownVersionBit for a version, ownUUIDBit for a packed value), the offsets
// in own of its name and of its value, and their lengths. A value that ends in a UUID keeps what
// comes before the UUID (as "gpu-") right after its name, once for all the devices whose values
// have that name and prefix, and its record's value length is the prefix's. The API server
// allows far shorter names and values, fewer devices and less text a slice than the records can
// tell; anything else stays in the device's map.
const (
	ownCountSize  = 2
	ownRecordSize = 8
	ownVersionBit = 1 << 15
	// ownUUIDBit: the value ends in a UUID, kept as its 16 bytes (packUUID). A device's own
	// attribute is most often its uuid, and a slice's uuids most of its own text.
	ownUUIDBit = 1 << 14
	// ownDevices bounds the devices a record tells, in the bits below the flags.
	ownDevices = ownUUIDBit
)

// ownAttribute is one record of own, decoded.
type ownAttribute struct {
	device             int
	nameOff, nameLen   int
	valueOff, valueLen int
	version, uuid      bool
}

// ownBuilder collects the own attributes of a slice, in device order.
type ownBuilder struct {
	attrs []ownAttribute
	// text are the names and values; names the distinct names' offsets in it.
	text  []byte
	names []int
}

// add adds attribute name of device i, unless the records cannot tell it.
func (b *ownBuilder) add(i int, name, value string, version bool) bool {
	if i >= ownDevices || len(name) > math.MaxUint8 || len(value) > math.MaxUint8 {
		return false
	}
	prefix, uuid := uuidTail(value)
	// A record reads its name's length, and a uuid's record its prefix after the name, so any
	// earlier copy of those bytes serves.
	key, valueLen, stored := name, len(value), len(value)
	if uuid {
		key, valueLen, stored = name+value[:prefix], prefix, uuidBytes
	}
	nameOff := -1
	for _, off := range b.names {
		if off+len(key) <= len(b.text) && string(b.text[off:off+len(key)]) == key {
			nameOff = off
			break
		}
	}
	grow := stored
	if nameOff < 0 {
		grow += len(key)
	}
	if ownCountSize+ownRecordSize*(len(b.attrs)+1)+len(b.text)+grow > math.MaxUint16 {
		return false
	}
	if nameOff < 0 {
		nameOff = len(b.text)
		b.names = append(b.names, nameOff)
		b.text = append(b.text, key...)
	}
	b.attrs = append(b.attrs, ownAttribute{device: i, nameOff: nameOff, nameLen: len(name), valueOff: len(b.text), valueLen: valueLen, version: version, uuid: uuid})
	if uuid {
		b.text = packUUID(b.text, value[prefix:])
	} else {
		b.text = append(b.text, value...)
	}
	return true
}

// encoded is the ownText of the attributes.
func (b *ownBuilder) encoded() []byte {
	if len(b.attrs) == 0 {
		return nil
	}
	head := ownCountSize + ownRecordSize*len(b.attrs)
	out := make([]byte, 0, head+len(b.text))
	out = binary.LittleEndian.AppendUint16(out, uint16(len(b.attrs)))
	for _, a := range b.attrs {
		device := a.device
		if a.version {
			device |= ownVersionBit
		}
		if a.uuid {
			device |= ownUUIDBit
		}
		out = binary.LittleEndian.AppendUint16(out, uint16(device))
		out = binary.LittleEndian.AppendUint16(out, uint16(head+a.nameOff))
		out = binary.LittleEndian.AppendUint16(out, uint16(head+a.valueOff))
		out = append(out, byte(a.nameLen), byte(a.valueLen))
	}
	return append(out, b.text...)
}

func le16(s string) int { return int(s[0]) | int(s[1])<<8 }

// ownText is a slice's own attributes as encoded.
type ownText string

// count is the number of own attributes.
func (o ownText) count() int {
	if len(o) < ownCountSize {
		return 0
	}
	return le16(string(o))
}

// at decodes own attribute k.
func (o ownText) at(k int) ownAttribute {
	r := string(o[ownCountSize+k*ownRecordSize:])
	device := le16(r)
	return ownAttribute{device: device &^ (ownVersionBit | ownUUIDBit), version: device&ownVersionBit != 0, uuid: device&ownUUIDBit != 0,
		nameOff: le16(r[2:]), valueOff: le16(r[4:]), nameLen: int(r[6]), valueLen: int(r[7])}
}

func (o ownText) name(a *ownAttribute) string {
	return string(o[a.nameOff : a.nameOff+a.nameLen])
}

// of returns the own attributes of device i: records lo to hi.
func (o ownText) of(i int) (lo, hi int) {
	n := o.count()
	lo = sort.Search(n, func(k int) bool { return o.at(k).device >= i })
	hi = lo
	for hi < n && o.at(hi).device == i {
		hi++
	}
	return lo, hi
}

func (o ownText) attribute(a *ownAttribute) resourceapi.DeviceAttribute {
	var v string
	if a.uuid {
		prefix := o[a.nameOff+a.nameLen : a.nameOff+a.nameLen+a.valueLen]
		v = string(unpackUUID([]byte(prefix), string(o[a.valueOff:a.valueOff+uuidBytes])))
	} else {
		v = string(o[a.valueOff : a.valueOff+a.valueLen])
	}
	if a.version {
		return resourceapi.DeviceAttribute{VersionValue: &v}
	}
	return resourceapi.DeviceAttribute{StringValue: &v}
}

// uuidLen and uuidBytes are a UUID's length written (8-4-4-4-12 hex digits) and packed.
const (
	uuidLen   = 36
	uuidBytes = 16
)

// uuidTail reports whether v ends in a UUID written in lower case, and the length of what comes
// before it (as "GPU-" of an NVIDIA GPU's uuid). Upper case would not come back the same from
// unpackUUID.
func uuidTail(v string) (prefix int, ok bool) {
	if len(v) < uuidLen {
		return 0, false
	}
	prefix = len(v) - uuidLen
	for i, c := range []byte(v[prefix:]) {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return 0, false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return 0, false
			}
		}
	}
	return prefix, true
}

// packUUID appends the 16 bytes of u, a UUID uuidTail accepts, to dst.
func packUUID(dst []byte, u string) []byte {
	for i := 0; i < uuidLen; i += 2 {
		if u[i] == '-' {
			i++
		}
		dst = append(dst, unhex(u[i])<<4|unhex(u[i+1]))
	}
	return dst
}

// unpackUUID appends the UUID of the 16 bytes b to dst, as packUUID read it.
func unpackUUID(dst []byte, b string) []byte {
	const digits = "0123456789abcdef"
	for i := range uuidBytes {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			dst = append(dst, '-')
		}
		dst = append(dst, digits[b[i]>>4], digits[b[i]&0xf])
	}
	return dst
}

func unhex(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'a' + 10
}
