// Package migrate gets every stored resource.k8s.io object to the API server's current storage
// version. kube-apiserver keeps an object in etcd in the version it was written in until something
// writes it again: objects created on 1.32 stay encoded as v1beta1, which a release that no longer
// knows v1beta1 (1.38) cannot read. Where the cluster serves storagemigration.k8s.io and its
// controller runs, one StorageVersionMigration per resource does the work; otherwise each object
// is rewritten by an update that changes nothing, which the API server stores re-encoded (and
// does not store at all when the object is already current).
package migrate
