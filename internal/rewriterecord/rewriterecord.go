// Package rewriterecord is the record `kubectl dra migrate` leaves when it rewrote every object of
// a resource.k8s.io resource itself, for `kubectl dra preflight` to read. A StorageVersionMigration
// leaves its own record (its Succeeded condition); a rewrite where that API is not served, or
// where its controller does not answer, leaves nothing the API server keeps, and the storage
// encoding of each object cannot be read through the API. So the migrate command writes one
// ConfigMap, a key per resource, and preflight trusts an entry only while the cluster runs the
// release that wrote it: a later release may store objects in another version.
package rewriterecord

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// The ConfigMap that holds the record: in kube-system, where only administrators write.
const (
	Namespace = "kube-system"
	Name      = "kubectl-dra-storage-rewrites"
)

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// maxEntryBytes bounds what is decoded of one entry: the record is read from the cluster.
const maxEntryBytes = 4 << 10

// Entry is one resource's completed rewrite.
type Entry struct {
	// Server is the API server's version (GitVersion) that stored the objects anew.
	Server string `json:"server"`
	// Version is the resource.k8s.io version the objects were read and written in.
	Version string `json:"version"`
	// Objects is how many objects were listed; every one was rewritten, found current or gone.
	Objects int `json:"objects"`
	// Completed is when the rewrite of the last object ended.
	Completed time.Time `json:"completed"`
}

// Write adds or replaces the entries (resource name to entry) in the record, leaving those of
// other resources as they are.
func Write(ctx context.Context, client dynamic.Interface, entries map[string]Entry) error {
	if len(entries) == 0 {
		return nil
	}
	data := map[string]any{}
	for res, e := range entries {
		b, err := json.Marshal(e)
		if err != nil {
			return fmt.Errorf("encode the entry of %s: %w", res, err)
		}
		data[res] = string(b)
	}
	cms := client.Resource(configMaps).Namespace(Namespace)
	patch, err := json.Marshal(map[string]any{"data": data})
	if err != nil {
		return err
	}
	_, err = cms.Patch(ctx, Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "kubectl-dra"})
	if !apierrors.IsNotFound(err) {
		return wrap(err)
	}
	cm := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": Name, "namespace": Namespace,
			"labels": map[string]any{"app.kubernetes.io/managed-by": "kubectl-dra"}},
		"data": data,
	}}
	_, err = cms.Create(ctx, cm, metav1.CreateOptions{FieldManager: "kubectl-dra"})
	if apierrors.IsAlreadyExists(err) {
		// Another run created it meanwhile: add to it.
		_, err = cms.Patch(ctx, Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "kubectl-dra"})
	}
	return wrap(err)
}

func wrap(err error) error {
	if err != nil {
		return fmt.Errorf("record the rewrite in ConfigMap %s/%s: %w", Namespace, Name, err)
	}
	return nil
}

// Decode reads the record's entries from the ConfigMap's data; an entry that does not parse is an
// error naming its key, as is one over 4 KiB.
func Decode(cm *corev1.ConfigMap) (map[string]Entry, error) {
	out := map[string]Entry{}
	if cm == nil {
		return out, nil
	}
	for res, v := range cm.Data {
		if len(v) > maxEntryBytes {
			return nil, fmt.Errorf("ConfigMap %s/%s data.%s: %d bytes, more than an entry holds (%d)", cm.Namespace, cm.Name, res, len(v), maxEntryBytes)
		}
		var e Entry
		if err := json.Unmarshal([]byte(v), &e); err != nil {
			return nil, fmt.Errorf("ConfigMap %s/%s data.%s: %w; delete the key and run kubectl dra migrate again", cm.Namespace, cm.Name, res, err)
		}
		out[res] = e
	}
	return out, nil
}
