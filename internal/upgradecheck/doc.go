// Package upgradecheck judges whether a cluster, its gpu-dra installation and a set of manifests
// survive an upgrade of the control plane to a later Kubernetes release: which resource.k8s.io
// versions the release stops serving (taken from the API types' lifecycle tags, not guessed),
// whether objects are still stored in an older encoding, which clients still call a version the
// release drops, and which manifests are written in one. It only reads; kubectl dra preflight
// prints what it finds.
package upgradecheck
