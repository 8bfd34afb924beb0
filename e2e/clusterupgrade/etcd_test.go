package clusterupgrade

import (
	"context"
	"os"
	"time"

	"github.com/gpu-dra/gpu-dra/internal/testetcd"
)

// storedVersions tells in which API version etcd holds each resource.k8s.io object: what the API
// server cannot say (it converts every read), and what a release that stops serving a version
// needs to know (it can no longer decode objects stored in it).
type storedVersions interface {
	// StoredVersions maps each object's etcd key to the apiVersion it is encoded in.
	StoredVersions(ctx context.Context) (map[string]string, error)
}

// etcdStore reads the local cluster's etcd directly (hack/local-up-cluster.sh serves it on
// 127.0.0.1:2379 without TLS; GPU_DRA_ETCD_ENDPOINT overrides).
type etcdStore struct{ endpoint string }

func localEtcd() etcdStore {
	if e := os.Getenv("GPU_DRA_ETCD_ENDPOINT"); e != "" {
		return etcdStore{endpoint: e}
	}
	return etcdStore{endpoint: "http://127.0.0.1:2379"}
}

// StoredVersions reads every key of the API server and keeps the objects of resource.k8s.io,
// recognised by the group of the version they are encoded in: built-in resources are stored
// under their resource name, without their group.
func (e etcdStore) StoredVersions(ctx context.Context) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	entries, err := testetcd.Read(ctx, e.endpoint, "/registry/")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, entry := range testetcd.InGroup(entries, "resource.k8s.io") {
		out[entry.Key] = entry.APIVersion
	}
	return out, nil
}
