// Package testetcd is a test library: it reads the keys kube-apiserver wrote to etcd, bypassing
// the API server, and says in which API version each object is encoded there. Only tests of what
// the API server stores (storage version migration) need it; only _test.go files import it.
package testetcd
