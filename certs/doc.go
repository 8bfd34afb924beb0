// Package certs keeps the webhook's serving certificate: in self mode it creates a CA and a
// serving certificate, stores them in a Secret shared by all replicas, renews them before they
// expire, patches the CA into the webhook configurations and writes the certificate to the
// directory the webhook server's cert watcher reloads from.
//
// # Why this is not a library's rotator
//
// The crypto is the standard library's; what is ours is the policy: what to issue, when to renew,
// how replicas agree (generate.go, renew.go, store.go: 558 lines). The candidate to replace it was
// github.com/open-policy-agent/cert-controller (pkg/rotator v0.16.0, used by Gatekeeper, Kueue and
// JobSet). It resolves with our pins (k8s.io/* v0.37.2, controller-runtime v0.25.2, Go 1.26); it
// was read and run against a real API server in a scratch copy (December 2026). We keep our code:
// the rotator gives up a guarantee our tests pin, needs more privilege and issues weaker
// certificates:
//
//   - A CA rotation replaces ca.crt outright. Replicas keep presenting the old serving
//     certificate until the kubelet refreshes their Secret volume (up to its sync period, a
//     minute by default), so the API server trusts none of them meanwhile, and with
//     failurePolicy Fail every claim is refused. Renew keeps the previous CA in the bundle
//     (TestRenewCAKeepsPreviousCA). The rotator reads CA keys only as RSA PKCS#1 and expects the
//     CA's name as a DNS SAN, so it replaced the CA of a Secret this package wrote: switching
//     would itself be such a rotation.
//   - It reads through informers: list and watch on every Secret of the namespace and on every
//     webhook configuration of the cluster, where this package needs get and update on one
//     Secret and two configurations. Both update whole configurations; confining the webhook to
//     caBundle (issue 15) takes an admission policy either way.
//   - Its certificates are RSA-2048 with serial 0 for every CA and 1 for every serving
//     certificate (RFC 5280 wants serials unique per issuer), a CA without a path length limit
//     and serving certificates that may outlive their CA. A missing webhook configuration is
//     logged and the rotator still reports ready.
//
// Two replicas are safe either way: like SecretStore, the rotator writes with the
// resourceVersion it read, and with two racing replicas the Secret was written once. Its upkeep is
// slow but alive: 18 releases since 2021, the last in March 2026 built against Kubernetes 1.35;
// since then only dependency bumps. What switching would save is small next to what it costs:
//
//	                      today          with the rotator
//	certs/ code           783 lines      183 (flags, TLS, glue), and 918 upstream to review
//	certs/ tests          697 lines      ~250 (estimate); 4 of today's fail by design
//	gpu-webhook binary    42,447,010 B   +401,408 B (+0.95%)
//	go list -m all        380 modules    383 (+3; 3 more linked into gpu-webhook)
//
// Revisit when the rotator keeps the previous CA through a rotation and can be held to one named
// Secret. Users who want a widely kept issuer have it already: the chart's certs.mode=auto uses
// cert-manager wherever the cluster serves it; self mode is for clusters without it.
package certs
