package clusterupgrade

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime"
)

// storedVersions tells in which API version etcd holds each resource.k8s.io object: what the API
// server cannot say (it converts every read), and what a release that stops serving a version
// needs to know (it can no longer decode objects stored in it).
type storedVersions interface {
	// StoredVersions maps each object's etcd key to the apiVersion it is encoded in.
	StoredVersions(ctx context.Context) (map[string]string, error)
}

// resourcePrefixes are where the API server keeps resource.k8s.io objects: built-in resources are
// stored under their resource name, without their group.
var resourcePrefixes = []string{
	"/registry/deviceclasses/",
	"/registry/resourceclaims/",
	"/registry/resourceclaimtemplates/",
	"/registry/resourceslices/",
	"/registry/devicetaintrules/",
}

// maxStoredObjects bounds what one prefix may hold before the check gives up rather than read it
// all into memory: the scenario stores a few dozen.
const maxStoredObjects = 10000

// etcdStore reads the local cluster's etcd directly (hack/local-up-cluster.sh serves it on
// 127.0.0.1:2379 without TLS; GPU_DRA_ETCD_ENDPOINT overrides).
type etcdStore struct{ endpoint string }

func localEtcd() etcdStore {
	if e := os.Getenv("GPU_DRA_ETCD_ENDPOINT"); e != "" {
		return etcdStore{endpoint: e}
	}
	return etcdStore{endpoint: "http://127.0.0.1:2379"}
}

func (e etcdStore) StoredVersions(ctx context.Context) (map[string]string, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.endpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", e.endpoint, err)
	}
	defer func() { _ = cli.Close() }()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out := map[string]string{}
	for _, prefix := range resourcePrefixes {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithLimit(maxStoredObjects))
		if err != nil {
			return nil, fmt.Errorf("etcd get %s*: %w", prefix, err)
		}
		if resp.More {
			return nil, fmt.Errorf("etcd holds more than %d keys under %s", maxStoredObjects, prefix)
		}
		for _, kv := range resp.Kvs {
			v, err := storedVersion(kv.Value)
			if err != nil {
				return nil, fmt.Errorf("etcd key %s: %w", kv.Key, err)
			}
			out[string(kv.Key)] = v
		}
	}
	return out, nil
}

// protobufMagic starts every object the API server stores as protobuf (k8s.io/apimachinery's
// protobuf serializer), followed by a runtime.Unknown whose typeMeta names the encoding version.
var protobufMagic = []byte{0x6b, 0x38, 0x73, 0x00}

// storedVersion is the apiVersion an etcd value is encoded in, protobuf or JSON.
func storedVersion(value []byte) (string, error) {
	if rest, ok := bytes.CutPrefix(value, protobufMagic); ok {
		var u runtime.Unknown
		if err := u.Unmarshal(rest); err != nil {
			return "", fmt.Errorf("protobuf envelope: %w", err)
		}
		if u.APIVersion == "" {
			return "", fmt.Errorf("protobuf envelope without apiVersion")
		}
		return u.APIVersion, nil
	}
	var meta struct {
		APIVersion string `json:"apiVersion"`
	}
	if err := json.Unmarshal(value, &meta); err != nil || meta.APIVersion == "" {
		return "", fmt.Errorf("neither protobuf nor JSON with an apiVersion (%d bytes): %v", len(value), err)
	}
	return meta.APIVersion, nil
}
