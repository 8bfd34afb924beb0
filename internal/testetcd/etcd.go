package testetcd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Prefix is where kube-apiserver keeps its objects (its --etcd-prefix default).
const Prefix = "/registry/"

// pageSize bounds one range request; maxKeys bounds a whole read, so a test against a large
// etcd fails clearly instead of reading all of it.
const (
	pageSize = 500
	maxKeys  = 100_000
)

// Encodings of a stored value.
const (
	Protobuf  = "protobuf"
	JSON      = "json"
	Encrypted = "encrypted"
)

// protobufMagic starts every value kube-apiserver stores as protobuf
// (k8s.io/apimachinery/pkg/runtime/serializer/protobuf): a runtime.Unknown follows, whose TypeMeta
// is the version the object was encoded in.
var protobufMagic = []byte("k8s\x00")

// encryptedPrefix starts values that an encryption provider of the API server wrote.
var encryptedPrefix = []byte("k8s:enc:")

// Entry is one stored object: its key and the version it is encoded in.
type Entry struct {
	Key        string
	APIVersion string
	Kind       string
	Encoding   string
}

// Group is the API group of the entry's version ("" for the core group and encrypted values).
func (e Entry) Group() string {
	gv, err := schema.ParseGroupVersion(e.APIVersion)
	if err != nil {
		return ""
	}
	return gv.Group
}

// Read lists every key under prefix from the etcd at endpoint (e.g. envtest's Etcd.URL) and
// decodes the version of each value, in key order.
func Read(ctx context.Context, endpoint, prefix string) ([]Entry, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second, Context: ctx})
	if err != nil {
		return nil, fmt.Errorf("connect to etcd %s: %w", endpoint, err)
	}
	defer c.Close()
	var entries []Entry
	end := clientv3.GetPrefixRangeEnd(prefix)
	for from := prefix; ; {
		resp, err := c.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(pageSize),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		if err != nil {
			return nil, fmt.Errorf("etcd %s: range %q: %w", endpoint, from, err)
		}
		for _, kv := range resp.Kvs {
			e, err := Decode(kv.Value)
			if err != nil {
				return nil, fmt.Errorf("etcd key %s: %w", kv.Key, err)
			}
			e.Key = string(kv.Key)
			entries = append(entries, e)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return entries, nil
		}
		if len(entries) >= maxKeys {
			return nil, fmt.Errorf("etcd %s: more than %d keys under %q", endpoint, maxKeys, prefix)
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// InGroup returns the entries whose objects belong to the API group, whatever the key's name.
func InGroup(entries []Entry, group string) []Entry {
	var in []Entry
	for _, e := range entries {
		if e.Group() == group {
			in = append(in, e)
		}
	}
	return in
}

// Decode says how a stored value is encoded and, unless it is encrypted, in which version.
func Decode(value []byte) (Entry, error) {
	switch {
	case bytes.HasPrefix(value, protobufMagic):
		var u runtime.Unknown
		if err := u.Unmarshal(value[len(protobufMagic):]); err != nil {
			return Entry{}, fmt.Errorf("protobuf envelope: %w", err)
		}
		return Entry{APIVersion: u.APIVersion, Kind: u.Kind, Encoding: Protobuf}, nil
	case bytes.HasPrefix(value, encryptedPrefix):
		return Entry{Encoding: Encrypted}, nil
	case bytes.HasPrefix(bytes.TrimSpace(value), []byte("{")):
		var tm runtime.TypeMeta
		if err := json.Unmarshal(value, &tm); err != nil {
			return Entry{}, fmt.Errorf("JSON value: %w", err)
		}
		return Entry{APIVersion: tm.APIVersion, Kind: tm.Kind, Encoding: JSON}, nil
	}
	return Entry{}, fmt.Errorf("neither protobuf (%q), JSON nor encrypted: starts with %q", protobufMagic, head(value))
}

func head(b []byte) string {
	const n = 16
	if len(b) > n {
		b = b[:n]
	}
	return strings.ToValidUTF8(string(b), "?")
}
